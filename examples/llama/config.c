/* examples/llama/config.c — HF config.json in and out for the Llama family (see config.h).
 *
 * Absent keys mean LlamaConfig's defaults (transformers' configuration_llama.py),
 * because that is what from_pretrained builds from the same file: vocab 32000,
 * hidden 4096, intermediate 11008, 32 layers, 32 heads, key/value heads = heads,
 * head_dim = hidden / heads, max positions 2048, rms_norm_eps 1e-6, rope_theta
 * 10000, no rope scaling, untied, SiLU, no biases, pretraining_tp 1; for
 * model_type "mistral" MistralConfig's (configuration_mistral.py), which differ
 * in intermediate 14336, key/value heads 8, max positions 131072 and a sliding
 * window of 4096.
 */
#include "llama/config.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/safetensors.h"
#include "nn/hfjson.h"

int llama_config_check(const llama_config_t *c, bmt_error_t *err)
{
    const struct {
        const char *name;
        long long v, max;
    } sizes[] = {
        { "num_hidden_layers", c->n_layer, 4096 },
        { "hidden_size", c->n_embd, 1 << 18 },
        { "num_attention_heads", c->n_head, 4096 },
        { "num_key_value_heads", c->n_kv_head, 4096 },
        { "head_dim", c->head_dim, 4096 },
        { "intermediate_size", c->ffn, 1 << 20 },
        { "vocab_size", c->vocab_size, 1 << 24 },
        { "max_position_embeddings", c->max_seq_len, 1 << 24 },
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (sizes[i].v < 1 || sizes[i].v > sizes[i].max)
            return nn_fail(err, "%s is %lld; it must be 1 to %lld", sizes[i].name, sizes[i].v,
                           sizes[i].max);
    if (c->n_head % c->n_kv_head != 0)
        return nn_fail(err,
                       "num_attention_heads %d is not a multiple of num_key_value_heads "
                       "%d (each key/value head serves the same number of query heads)",
                       c->n_head, c->n_kv_head);
    if (c->head_dim % 2 != 0)
        return nn_fail(err, "head_dim %d is odd; rotary positions rotate pairs of channels",
                       c->head_dim);
    /* Both reach the layers as float32 (nn_rmsnorm_forward's eps, nn_rope_freqs'
     * inv_freq up to 1/theta): below FLT_MIN an eps is subnormal or 0 (a row of
     * zeros then normalizes to 0 * inf = NaN) and a frequency may pass FLT_MAX. */
    if (!(c->rms_eps >= FLT_MIN && c->rms_eps < 1))
        return nn_fail(err,
                       "rms_norm_eps %g must be in (0, 1) and at least %g (FLT_MIN: the "
                       "layers take it in float32)",
                       c->rms_eps, FLT_MIN);
    if (!(c->rope_theta >= FLT_MIN && isfinite(c->rope_theta)))
        return nn_fail(err,
                       "rope_theta %g must be a positive number of at least %g (FLT_MIN: the "
                       "frequencies, up to 1/rope_theta, are float32)",
                       c->rope_theta, FLT_MIN);
    if (c->rope_llama3 &&
        !(c->rope_factor >= 1 && c->rope_low_freq_factor > 0 &&
          c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_original_max >= 1 &&
          isfinite(c->rope_factor) && isfinite(c->rope_high_freq_factor)))
        return nn_fail(err,
                       "rope_scaling llama3 needs factor >= 1, 0 < low_freq_factor < "
                       "high_freq_factor and original_max_position_embeddings >= 1; got %g, %g, "
                       "%g, %d",
                       c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                       c->rope_original_max);
    if (c->n_eos < 0 || c->n_eos > LLAMA_MAX_EOS)
        return nn_fail(err, "%d end-of-sequence tokens (at most %d)", c->n_eos, LLAMA_MAX_EOS);
    if (c->bos_token_id >= c->vocab_size)
        return nn_fail(err, "bos_token_id %d is outside the vocabulary of %d", c->bos_token_id,
                       c->vocab_size);
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] < 0 || c->eos_token_ids[i] >= c->vocab_size)
            return nn_fail(err, "eos_token_id %d is outside the vocabulary of %d",
                           c->eos_token_ids[i], c->vocab_size);
    return 0;
}

/* rope_scaling (key "rope_scaling"): null, {"rope_type"|"type": "default"}, or
 * Llama 3's. transformers 5's rope_parameters (key "rope_parameters") is the
 * same object with rope_theta inside, and a missing type means "default"
 * (its standardize_rope_params); rope_theta is read by the caller. */
static int rope_scaling(const json_t *v, const char *file, const char *key, llama_config_t *c,
                        bmt_error_t *err)
{
    const bool params = strcmp(key, "rope_parameters") == 0;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return nn_hf_wrong_type(err, file, key, "an object or null", v);
    const json_t *t = json_object_get(v, "rope_type");
    const json_t *t2 = json_object_get(v, "type");
    if (t == NULL)
        t = t2;
    if (t == NULL && params) {
        /* transformers 5 nests one object per layer type for models that mix
         * them: not Llama's */
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e)
        {
            if (json_is_object(e))
                return nn_hf_unsupported(err, file, key, v,
                                         "one object of rope_theta and the rope type (not one "
                                         "per layer type)");
        }
        return 0; /* "default" */
    }
    if (t == NULL || !json_is_string(t))
        return nn_fail(err, "%s: malformed: %s needs a string \"rope_type\"", file, key);
    if (t2 && (!json_is_string(t2) || strcmp(json_string_value(t2), json_string_value(t)) != 0))
        return nn_fail(err, "%s: %s's \"type\" and \"rope_type\" differ", file, key);
    const char *type = json_string_value(t);
    if (strcmp(type, "default") == 0)
        return 0;
    if (strcmp(type, "llama3") != 0)
        return nn_hf_unsupported(err, file,
                                 params ? "rope_parameters.rope_type" : "rope_scaling.rope_type", t,
                                 "\"llama3\", \"default\" or null");
    const struct {
        const char *key;
        double *out;
    } num[] = {
        { "factor", &c->rope_factor },
        { "low_freq_factor", &c->rope_low_freq_factor },
        { "high_freq_factor", &c->rope_high_freq_factor },
    };
    for (size_t i = 0; i < sizeof(num) / sizeof(num[0]); i++) {
        const json_t *x = json_object_get(v, num[i].key);
        if (x == NULL || !json_is_number(x))
            return nn_fail(err, "%s: malformed: %s llama3 needs a number \"%s\"", file, key,
                           num[i].key);
        *num[i].out = json_number_value(x);
    }
    const json_t *o = json_object_get(v, "original_max_position_embeddings");
    if (o == NULL || !json_is_integer(o))
        return nn_fail(err,
                       "%s: malformed: %s llama3 needs an integer "
                       "\"original_max_position_embeddings\"",
                       file, key);
    if (json_integer_value(o) < 1 || json_integer_value(o) > (1 << 24))
        return nn_fail(err, "%s: %s's original_max_position_embeddings %lld is out of range", file,
                       key, (long long)json_integer_value(o));
    c->rope_original_max = (int)json_integer_value(o);
    c->rope_llama3 = true;
    return 0;
}

/* transformers 5's rope_parameters: {"rope_type": ..., "rope_theta": ...,
 * and Llama 3's keys}, written instead of rope_theta and rope_scaling. Given
 * with either of those, they must say the same (or it is refused). */
static int rope_parameters(const json_t *root, const char *file, llama_config_t *c,
                           bmt_error_t *err)
{
    const json_t *v = json_object_get(root, "rope_parameters");
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return nn_hf_wrong_type(err, file, "rope_parameters", "an object or null", v);
    const json_t *th = json_object_get(v, "rope_theta");
    if (th && !json_is_number(th))
        return nn_hf_wrong_type(err, file, "rope_parameters.rope_theta", "a number", th);
    const json_t *top = json_object_get(root, "rope_theta");
    if (th && top && json_number_value(top) != json_number_value(th))
        return nn_fail(err, "%s: rope_theta is %s but rope_parameters.rope_theta is %s", file,
                       nn_json_show(top).s, nn_json_show(th).s);
    const json_t *prf = json_object_get(v, "partial_rotary_factor");
    if (prf && !json_is_null(prf) && !(json_is_number(prf) && json_number_value(prf) == 1))
        return nn_hf_unsupported(err, file, "rope_parameters.partial_rotary_factor", prf,
                                 "1 or absent (every channel of a head rotates)");
    /* c holds rope_scaling's reading (all zero when it is absent, null or the
     * default); the two must describe the same scaling. */
    llama_config_t t = *c;
    t.rope_llama3 = false;
    t.rope_factor = t.rope_low_freq_factor = t.rope_high_freq_factor = 0;
    t.rope_original_max = 0;
    if (rope_scaling(v, file, "rope_parameters", &t, err) < 0)
        return -1;
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs) &&
        (t.rope_llama3 != c->rope_llama3 || t.rope_factor != c->rope_factor ||
         t.rope_low_freq_factor != c->rope_low_freq_factor ||
         t.rope_high_freq_factor != c->rope_high_freq_factor ||
         t.rope_original_max != c->rope_original_max))
        return nn_fail(err,
                       "%s: rope_scaling and rope_parameters are both given and describe "
                       "different scalings: give one (transformers 5 writes rope_parameters)",
                       file);
    if (th)
        t.rope_theta = json_number_value(th);
    *c = t;
    return 0;
}

/* A token id key: an integer, null, or (eos) a list of them. */
static int token_ids(const json_t *v, const char *file, const char *key, int *ids, int max, int *n,
                     bmt_error_t *err)
{
    *n = 0;
    if (v == NULL || json_is_null(v))
        return 0;
    if (json_is_integer(v)) {
        ids[(*n)++] = (int)json_integer_value(v);
        return json_integer_value(v) < 0 || json_integer_value(v) > (1 << 24)
                   ? nn_fail(err, "%s: %s %lld is out of range", file, key,
                             (long long)json_integer_value(v))
                   : 0;
    }
    if (!json_is_array(v) || max == 1)
        return nn_hf_wrong_type(err, file, key,
                                max == 1 ? "an integer or null" : "an integer, a list or null", v);
    if (json_array_size(v) > (size_t)max)
        return nn_fail(err, "%s: %s lists %zu tokens; at most %d", file, key, json_array_size(v),
                       max);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > (1 << 24))
            return nn_fail(err, "%s: malformed: %s[%zu] must be a token id", file, key, i);
        ids[(*n)++] = (int)json_integer_value(e);
    }
    return 0;
}

int llama_config_from_hf_json(const char *text, const char *file, llama_config_t *cfg,
                              bmt_error_t *err)
{
    json_t *root = nn_hf_json_load(text, file, err);
    if (root == NULL)
        return -1;
    int rc = 0;
    llama_config_t c = { 0 };
    const json_t *v;
    if (!json_is_object(root))
        rc = nn_fail(err, "%s: malformed: a JSON object is needed, not %s", file,
                     nn_json_kind(root));

    static const char *const types[] = { "llama", "mistral", NULL };
    const char *model_type = NULL;
    if (rc == 0)
        rc = nn_hf_string(root, file, "model_type", types, "\"llama\", \"mistral\"", &model_type,
                          err);
    if (rc == 0 && (v = json_object_get(root, "architectures")) != NULL && !json_is_null(v)) {
        if (!json_is_array(v))
            rc = nn_hf_wrong_type(err, file, "architectures", "an array of strings", v);
        for (size_t i = 0; rc == 0 && i < json_array_size(v); i++) {
            const json_t *e = json_array_get(v, i);
            static const char *const archs[] = { "LlamaForCausalLM", "LlamaModel",
                                                 "MistralForCausalLM", "MistralModel" };
            bool known = false;
            for (size_t k = 0; json_is_string(e) && k < sizeof(archs) / sizeof(archs[0]); k++)
                known |= strcmp(json_string_value(e), archs[k]) == 0;
            if (!json_is_string(e))
                rc = nn_hf_wrong_type(err, file, "architectures", "an array of strings", e);
            else if (!known)
                rc = nn_hf_unsupported(err, file, "architectures[]", e,
                                       "\"LlamaForCausalLM\", \"MistralForCausalLM\" (or their "
                                       "Model)");
        }
    }

    /* from_pretrained builds a "mistral" config.json as a MistralConfig, whose
     * defaults differ from LlamaConfig's: intermediate_size 14336,
     * num_key_value_heads 8 (null: the heads), max_position_embeddings 131072
     * and sliding_window 4096. */
    const bool mistral = model_type && strcmp(model_type, "mistral") == 0;

    /* Sizes, with LlamaConfig's (or MistralConfig's) defaults. */
    const struct {
        const char *key;
        long long dflt;
        int *out;
    } sizes[] = {
        { "vocab_size", 32000, &c.vocab_size },
        { "hidden_size", 4096, &c.n_embd },
        { "intermediate_size", mistral ? 14336 : 11008, &c.ffn },
        { "num_hidden_layers", 32, &c.n_layer },
        { "num_attention_heads", 32, &c.n_head },
        { "max_position_embeddings", mistral ? 131072 : 2048, &c.max_seq_len },
    };
    for (size_t i = 0; rc == 0 && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        long long x;
        bool given;
        rc = nn_hf_int(root, file, sizes[i].key, NULL, sizes[i].dflt, false, &x, &given, err);
        if (rc == 0 && (x < 1 || x > (1LL << 24)))
            rc = nn_fail(err, "%s: %s is %lld; it must be 1 to %d", file, sizes[i].key, x, 1 << 24);
        if (rc == 0)
            *sizes[i].out = (int)x;
    }
    long long kv = 0, hd = 0;
    bool given = false;
    if (rc == 0) {
        const json_t *k = json_object_get(root, "num_key_value_heads");
        rc = nn_hf_int(root, file, "num_key_value_heads", NULL, mistral && k == NULL ? 8 : c.n_head,
                       true, &kv, &given, err);
    }
    if (rc == 0 && (kv < 1 || kv > 4096))
        rc = nn_fail(err, "%s: num_key_value_heads is %lld; it must be 1 to 4096", file, kv);
    if (rc == 0 && c.n_embd % c.n_head != 0 && json_object_get(root, "head_dim") == NULL)
        rc = nn_fail(err,
                     "%s: hidden_size %d is not a multiple of num_attention_heads %d and "
                     "head_dim is absent",
                     file, c.n_embd, c.n_head);
    if (rc == 0)
        rc = nn_hf_int(root, file, "head_dim", NULL, c.n_embd / c.n_head, true, &hd, &given, err);
    if (rc == 0 && (hd < 1 || hd > 4096))
        rc = nn_fail(err, "%s: head_dim is %lld; it must be 1 to 4096", file, hd);
    if (rc == 0) {
        c.n_kv_head = (int)kv;
        c.head_dim = (int)hd;
    }
    if (rc == 0)
        rc = nn_hf_number(root, file, "rms_norm_eps", 1e-6, &c.rms_eps, err);
    if (rc == 0)
        rc = nn_hf_number(root, file, "rope_theta", 10000.0, &c.rope_theta, err);
    if (rc == 0)
        rc = rope_scaling(json_object_get(root, "rope_scaling"), file, "rope_scaling", &c, err);
    if (rc == 0)
        rc = rope_parameters(root, file, &c, err);
    if (rc == 0 && (v = json_object_get(root, "tie_word_embeddings")) != NULL &&
        !json_is_boolean(v))
        rc = nn_hf_wrong_type(err, file, "tie_word_embeddings", "true or false", v);
    if (rc == 0)
        c.tied = v && json_is_true(v);

    /* What a layer computes: only what the model implements. */
    static const char *const silu[] = { "silu", NULL };
    if (rc == 0)
        rc = nn_hf_string(root, file, "hidden_act", silu, "\"silu\" (SwiGLU)", NULL, err);
    if (rc == 0)
        rc = nn_hf_bool(root, file, "attention_bias", false, "false (no q/k/v/o biases)", err);
    if (rc == 0)
        rc = nn_hf_bool(root, file, "mlp_bias", false, "false (no MLP biases)", err);
    if (rc == 0 && (v = json_object_get(root, "pretraining_tp")) != NULL &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        rc = nn_hf_unsupported(err, file, "pretraining_tp", v, "1 (HF computes slices otherwise)");
    if (rc == 0 && (v = json_object_get(root, "attention_dropout")) != NULL &&
        !(json_is_number(v) && json_number_value(v) == 0))
        rc = nn_hf_unsupported(err, file, "attention_dropout", v, "0");
    if (rc == 0 && (v = json_object_get(root, "sliding_window")) != NULL && !json_is_null(v))
        rc = nn_hf_unsupported(err, file, "sliding_window", v,
                               "null (attention over the whole causal context)");
    if (rc == 0 && mistral && v == NULL)
        rc = nn_fail(
            err,
            "%s: sliding_window is absent, which MistralConfig takes as 4096 (attention "
            "over the last 4096 positions only); supported: null (write \"sliding_window\": "
            "null for attention over the whole causal context)",
            file);
    static const char *const gone[] = { "partial_rotary_factor" };
    for (size_t i = 0; rc == 0 && i < sizeof(gone) / sizeof(gone[0]); i++)
        if ((v = json_object_get(root, gone[i])) != NULL && !json_is_null(v))
            rc = nn_hf_unsupported(err, file, gone[i], v, "absent (Llama's rotary embedding)");

    int nbos = 0;
    if (rc == 0)
        rc = token_ids(json_object_get(root, "bos_token_id"), file, "bos_token_id", &c.bos_token_id,
                       1, &nbos, err);
    if (rc == 0 && nbos == 0)
        c.bos_token_id = -1;
    if (rc == 0)
        rc = token_ids(json_object_get(root, "eos_token_id"), file, "eos_token_id", c.eos_token_ids,
                       LLAMA_MAX_EOS, &c.n_eos, err);
    json_decref(root);
    if (rc == 0) {
        bmt_error_t why = { { 0 } };
        if (llama_config_check(&c, &why) < 0)
            rc = nn_fail(err, "%s: %s", file, why.text);
    }
    if (rc == 0)
        *cfg = c;
    return rc;
}

int llama_config_from_file(const char *path, llama_config_t *cfg, bmt_error_t *err)
{
    char file[4096], *text = NULL;
    if (nn_hf_config_path(path, file, sizeof(file), err) < 0 ||
        nn_hf_config_read(file, &text, err) < 0)
        return -1;
    if (text == NULL)
        return nn_fail(err, "%s: no such file: a Llama model directory needs its config.json",
                       file);
    int rc = llama_config_from_hf_json(text, file, cfg, err);
    free(text);
    return rc;
}

void llama_layer_tensors(const llama_config_t *c, llama_tensor_spec_t out[LLAMA_LAYER_TENSORS])
{
    const int64_t C = c->n_embd, F = c->ffn;
    const int64_t Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_kv_head * c->head_dim;
    const llama_tensor_spec_t t[LLAMA_LAYER_TENSORS] = {
        { "input_layernorm.weight", C, 0 },   { "self_attn.q_proj.weight", Q, C },
        { "self_attn.k_proj.weight", KV, C }, { "self_attn.v_proj.weight", KV, C },
        { "self_attn.o_proj.weight", C, Q },  { "post_attention_layernorm.weight", C, 0 },
        { "mlp.gate_proj.weight", F, C },     { "mlp.up_proj.weight", F, C },
        { "mlp.down_proj.weight", C, F },
    };
    memcpy(out, t, sizeof(t));
}

int llama_config_check_files(const llama_config_t *c, const char *path, bmt_error_t *err)
{
    bmt_st_t *st = bmt_st_open(path, err);
    if (st == NULL)
        return -1;
    bmt_st_plan_t *plan = NULL;
    int rc = bmt_st_discover(st, &plan, err);
    if (rc == 0 && plan->nlayers != c->n_layer)
        rc = nn_fail(err,
                     "%.900s holds %d layers (%.60s<N>); config.json has %d (num_hidden_layers)",
                     path, plan->nlayers, plan->layer_prefix, c->n_layer);
    bmt_st_plan_free(plan);
    const int64_t C = c->n_embd, V = c->vocab_size;
    const llama_tensor_spec_t top[] = { { "model.embed_tokens.weight", V, C },
                                        { "model.norm.weight", C, 0 },
                                        { "lm_head.weight", V, C } };
    llama_tensor_spec_t layer[LLAMA_LAYER_TENSORS];
    llama_layer_tensors(c, layer);
    const int ntop = c->tied ? 2 : 3, nl = LLAMA_LAYER_TENSORS;
    for (int i = 0; rc == 0 && i < ntop + c->n_layer * nl; i++) {
        char name[160];
        int64_t d0, d1;
        if (i < ntop) {
            snprintf(name, sizeof(name), "%s", top[i].name);
            d0 = top[i].d0, d1 = top[i].d1;
        } else {
            const int l = (i - ntop) / nl, j = (i - ntop) % nl;
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, layer[j].name);
            d0 = layer[j].d0, d1 = layer[j].d1;
        }
        const int k = bmt_st_find(st, name);
        const bmt_st_tensor_t *t = k >= 0 ? bmt_st_tensor(st, k) : NULL;
        if (t == NULL)
            rc = nn_fail(err, "%.900s has no tensor '%s', which config.json's model needs", path,
                         name);
        else if (t->ndim != (d1 ? 2 : 1) || t->shape[0] != d0 || (d1 && t->shape[1] != d1)) {
            char got[96] = "";
            for (int d = 0, n = 0; d < t->ndim && n < (int)sizeof(got); d++)
                n += snprintf(got + n, sizeof(got) - (size_t)n, "%s%lld", d ? ", " : "",
                              (long long)t->shape[d]);
            char want[64];
            if (d1)
                snprintf(want, sizeof(want), "%lld, %lld", (long long)d0, (long long)d1);
            else
                snprintf(want, sizeof(want), "%lld", (long long)d0);
            rc = nn_fail(err, "%.900s: tensor '%s' is (%s); config.json's model needs (%s)", path,
                         name, got, want);
        }
    }
    bmt_st_close(st);
    return rc;
}

int llama_hf_config_json(const llama_config_t *cfg, bmt_dtype_t dtype, char **json,
                         bmt_error_t *err)
{
    if (llama_config_check(cfg, err) < 0)
        return -1;
    if (dtype != BMT_F32 && dtype != BMT_BF16)
        return nn_fail(err, "config.json for %s parameters: only f32 and bf16 are written",
                       bmt_dtype_name(dtype));
    json_t *rope = cfg->rope_llama3
                       ? json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", cfg->rope_factor,
                                   "low_freq_factor", cfg->rope_low_freq_factor, "high_freq_factor",
                                   cfg->rope_high_freq_factor, "original_max_position_embeddings",
                                   cfg->rope_original_max, "rope_type", "llama3")
                       : json_null();
    json_t *eos = json_null();
    if (cfg->n_eos == 1)
        eos = json_integer(cfg->eos_token_ids[0]);
    else if (cfg->n_eos > 1) {
        eos = json_array();
        for (int i = 0; i < cfg->n_eos; i++)
            json_array_append_new(eos, json_integer(cfg->eos_token_ids[i]));
    }
    json_t *j = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:o, s:b, s:b, s:b, "
        "s:f, s:i, s:f, s:o, s:o, s:b, s:s}",
        "architectures", "LlamaForCausalLM", "model_type", "llama", "vocab_size", cfg->vocab_size,
        "hidden_size", cfg->n_embd, "intermediate_size", cfg->ffn, "num_hidden_layers",
        cfg->n_layer, "num_attention_heads", cfg->n_head, "num_key_value_heads", cfg->n_kv_head,
        "head_dim", cfg->head_dim, "max_position_embeddings", cfg->max_seq_len, "hidden_act",
        "silu", "rms_norm_eps", cfg->rms_eps, "rope_theta", cfg->rope_theta, "rope_scaling", rope,
        "tie_word_embeddings", cfg->tied, "attention_bias", 0, "mlp_bias", 0, "attention_dropout",
        0.0, "pretraining_tp", 1, "initializer_range", 0.02, "bos_token_id",
        cfg->bos_token_id >= 0 ? json_integer(cfg->bos_token_id) : json_null(), "eos_token_id", eos,
        "use_cache", 1, "torch_dtype", dtype == BMT_F32 ? "float32" : "bfloat16");
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(j);
    char *out = text ? malloc(strlen(text) + 2) : NULL;
    if (out == NULL) {
        free(text);
        return nn_fail(err, "config.json: out of memory");
    }
    snprintf(out, strlen(text) + 2, "%s\n", text);
    free(text);
    *json = out;
    return 0;
}

int64_t llama_num_params(const llama_config_t *c)
{
    const int64_t C = c->n_embd, F = c->ffn, V = c->vocab_size;
    const int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_kv_head * c->head_dim;
    const int64_t layer = 2 * C + 2 * C * q + 2 * C * kv + 3 * C * F;
    return V * C + c->n_layer * layer + C + (c->tied ? 0 : V * C);
}

double llama_flops_per_token(const llama_config_t *c, int T)
{
    return 6.0 * (double)llama_num_params(c) +
           6.0 * c->n_layer * (double)c->n_head * c->head_dim * (double)T;
}
