/* examples/generate/gencfg.c — generation_config.json (see gencfg.h).
 *
 * Layer: pure parsing over Jansson and nn/hfjson.h's messages, and one read
 * of the file (nn_hf_config_read: bounded, never blocking on a FIFO).
 *
 * Which settings change the tokens of HF's greedy generate(): the logits
 * processors that transformers' GenerationMixin._get_logits_processor adds
 * outside `if generation_config.do_sample` (each one below, with the value
 * that leaves it out), and the settings that pick another decoding method
 * than greedy (beams, contrastive search, DoLa) or stop it elsewhere (stop
 * strings, a time limit). A neutral value is accepted, so a file that names
 * such a key with its default still reads.
 */
#include "gencfg.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/hfjson.h"

/* How a setting's value reads, and which values leave generate() greedy as
 * generate computes it. */
typedef enum neutral {
    N_NUMBER_ONE,  /* a number or null; neutral: null or 1 */
    N_NUMBER_ZERO, /* a number or null; neutral: null or <= 0 */
    N_INT_ZERO,    /* an integer or null; neutral: null or <= 0 */
    N_INT_ONE,     /* an integer or null; neutral: null or <= 1 */
    N_BOOL,        /* a boolean or null; neutral: null or false */
    N_NULL,        /* anything; neutral: null, [] or {} */
} neutral_t;

static const struct {
    const char *key;
    neutral_t neutral;
    bool with_eos; /* HF applies it only when there is an end-of-sequence id */
    const char *what;
} changes[] = {
    { "repetition_penalty", N_NUMBER_ONE, false, "a repetition penalty" },
    { "encoder_repetition_penalty", N_NUMBER_ONE, false, "a penalty on the prompt's tokens" },
    { "no_repeat_ngram_size", N_INT_ZERO, false, "a ban on repeated n-grams" },
    { "encoder_no_repeat_ngram_size", N_INT_ZERO, false, "a ban on the prompt's n-grams" },
    { "min_length", N_INT_ZERO, true,
      "a minimum length: the end-of-sequence ids masked before it" },
    { "min_new_tokens", N_INT_ZERO, true,
      "a minimum length: the end-of-sequence ids masked before it" },
    { "num_beams", N_INT_ONE, false, "beam search" },
    { "num_beam_groups", N_INT_ONE, false, "group beam search" },
    { "penalty_alpha", N_NUMBER_ZERO, false, "contrastive search" },
    { "dola_layers", N_NULL, false, "DoLa decoding" },
    { "guidance_scale", N_NUMBER_ONE, false, "classifier-free guidance" },
    { "bad_words_ids", N_NULL, false, "banned token sequences" },
    { "sequence_bias", N_NULL, false, "biased token sequences" },
    { "suppress_tokens", N_NULL, false, "suppressed tokens" },
    { "begin_suppress_tokens", N_NULL, false, "tokens suppressed at the first step" },
    { "forced_bos_token_id", N_NULL, false, "a forced first token" },
    { "forced_eos_token_id", N_NULL, false, "a forced last token" },
    { "forced_decoder_ids", N_NULL, false, "forced tokens" },
    { "exponential_decay_length_penalty", N_NULL, false,
      "an end-of-sequence bias growing with the length" },
    { "force_words_ids", N_NULL, false, "constrained beam search" },
    { "constraints", N_NULL, false, "constrained beam search" },
    { "watermarking_config", N_NULL, false, "a watermark" },
    { "stop_strings", N_NULL, false, "stop strings (they need a tokenizer)" },
    { "token_healing", N_BOOL, false, "token healing (it needs a tokenizer)" },
    { "max_time", N_NULL, false, "a time limit" },
};

/* The sampling settings: read for their type and for -v, never applied. */
static const struct {
    const char *key;
    json_type type; /* JSON_TRUE: a boolean; JSON_INTEGER; JSON_REAL: a number */
} sampling[] = {
    { "do_sample", JSON_TRUE },      { "temperature", JSON_REAL }, { "top_k", JSON_INTEGER },
    { "top_p", JSON_REAL },          { "min_p", JSON_REAL },       { "typical_p", JSON_REAL },
    { "epsilon_cutoff", JSON_REAL }, { "eta_cutoff", JSON_REAL },
};

static const char *neutral_text(neutral_t n)
{
    switch (n) {
    case N_NUMBER_ONE: return "1.0 or null";
    case N_NUMBER_ZERO: return "0 or null";
    case N_INT_ZERO: return "0 or null";
    case N_INT_ONE: return "1 or null";
    case N_BOOL: return "false or null";
    case N_NULL: break;
    }
    return "null";
}

/* 0 when v (not NULL, not null) is neutral, 1 when it is not, -1 and err when
 * it has another type than the setting takes. */
static int active(const json_t *v, neutral_t n, const char *file, const char *key, bmt_error_t *err)
{
    switch (n) {
    case N_NUMBER_ONE:
    case N_NUMBER_ZERO:
        if (!json_is_number(v))
            return nn_hf_wrong_type(err, file, key, "a number or null", v);
        return n == N_NUMBER_ONE ? json_number_value(v) != 1.0 : json_number_value(v) > 0;
    case N_INT_ZERO:
    case N_INT_ONE:
        if (!json_is_integer(v))
            return nn_hf_wrong_type(err, file, key, "an integer or null", v);
        return json_integer_value(v) > (n == N_INT_ONE ? 1 : 0);
    case N_BOOL:
        if (!json_is_boolean(v))
            return nn_hf_wrong_type(err, file, key, "true, false or null", v);
        return json_is_true(v);
    case N_NULL:
        return !((json_is_array(v) && json_array_size(v) == 0) ||
                 (json_is_object(v) && json_object_size(v) == 0));
    }
    return 1;
}

static int eos_ids(const json_t *v, const char *file, int vocab, gen_gencfg_t *g, bmt_error_t *err)
{
    g->n_eos = 0;
    g->eos_given = v != NULL && !json_is_null(v);
    if (!g->eos_given)
        return 0;
    if (!json_is_integer(v) && !json_is_array(v))
        return nn_hf_wrong_type(err, file, "eos_token_id", "an integer, a list or null", v);
    const size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > GEN_MAX_EOS)
        return nn_fail(err, "%s: eos_token_id lists %zu tokens; at most %d", file, n, GEN_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e))
            return nn_fail(err, "%s: malformed: eos_token_id[%zu] must be a token id, not %s", file,
                           i, nn_json_kind(e));
        if (json_integer_value(e) < 0 || json_integer_value(e) >= vocab)
            return nn_fail(err, "%s: eos_token_id %s is not a token of the vocabulary [0, %d)",
                           file, nn_json_show(e).s, vocab);
        g->eos[g->n_eos++] = (int)json_integer_value(e);
    }
    return 0;
}

/* The sampling settings of root (an object) into t->sampling, and the
 * settings that change HF's greedy tokens refused; n_eos: the end-of-sequence
 * ids that apply (some settings act only with them). */
static int settings(const json_t *root, const char *file, int n_eos, gen_gencfg_t *t,
                    bmt_error_t *err)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(sampling) / sizeof(sampling[0]); i++) {
        const json_t *v = json_object_get(root, sampling[i].key);
        if (v == NULL || json_is_null(v))
            continue;
        const bool ok = sampling[i].type == JSON_TRUE      ? json_is_boolean(v)
                        : sampling[i].type == JSON_INTEGER ? json_is_integer(v)
                                                           : json_is_number(v);
        if (!ok)
            rc = nn_hf_wrong_type(err, file, sampling[i].key,
                                  sampling[i].type == JSON_TRUE      ? "true, false or null"
                                  : sampling[i].type == JSON_INTEGER ? "an integer or null"
                                                                     : "a number or null",
                                  v);
        else {
            const size_t at = strlen(t->sampling);
            snprintf(t->sampling + at, sizeof(t->sampling) - at, "%s%s %s", at ? ", " : "",
                     sampling[i].key, nn_json_show(v).s);
        }
    }
    for (size_t i = 0; rc == 0 && i < sizeof(changes) / sizeof(changes[0]); i++) {
        const json_t *v = json_object_get(root, changes[i].key);
        if (v == NULL || json_is_null(v))
            continue;
        const int on = active(v, changes[i].neutral, file, changes[i].key, err);
        if (on < 0)
            rc = -1;
        else if (on && (!changes[i].with_eos || n_eos > 0))
            rc = nn_fail(err,
                         "%s: %s is %s: %s, which transformers' generate() applies and generate "
                         "does not (the tokens would differ); supported: %s",
                         file, changes[i].key, nn_json_show(v).s, changes[i].what,
                         neutral_text(changes[i].neutral));
    }
    return rc;
}

/* gen_gencfg_parse (model false: a generation_config.json, its own
 * end-of-sequence ids) and gen_gencfg_parse_model (true: a config.json, n_eos
 * ids applying). */
static int parse(const char *text, const char *file, bool model, int vocab, int n_eos,
                 gen_gencfg_t *g, bmt_error_t *err)
{
    json_t *root = nn_hf_json_load(text, file, err);
    if (root == NULL)
        return -1;
    gen_gencfg_t t;
    memset(&t, 0, sizeof(t));
    t.present = !model;
    int rc = json_is_object(root) ? 0
                                  : nn_fail(err, "%s: malformed: a JSON object is needed, not %s",
                                            file, nn_json_kind(root));
    if (rc == 0 && !model)
        rc = eos_ids(json_object_get(root, "eos_token_id"), file, vocab, &t, err);
    if (rc == 0)
        rc = settings(root, file, model ? n_eos : t.n_eos, &t, err);
    json_decref(root);
    if (rc == 0)
        *g = t;
    return rc;
}

int gen_gencfg_parse(const char *text, const char *file, int vocab, gen_gencfg_t *g,
                     bmt_error_t *err)
{
    return parse(text, file, false, vocab, 0, g, err);
}

int gen_gencfg_parse_model(const char *text, const char *file, int n_eos, gen_gencfg_t *g,
                           bmt_error_t *err)
{
    return parse(text, file, true, 0, n_eos, g, err);
}

int gen_gencfg_read(const char *dir, int vocab, gen_gencfg_t *g, bmt_error_t *err)
{
    char file[4200];
    if ((size_t)snprintf(file, sizeof(file), "%s/%s", dir, GEN_GENCFG_NAME) >= sizeof(file))
        return nn_fail(err, "%s: the path is too long", dir);
    char *text = NULL;
    if (nn_hf_config_read(file, &text, err) < 0)
        return -1;
    if (text == NULL) {
        memset(g, 0, sizeof(*g));
        return 0;
    }
    const int rc = gen_gencfg_parse(text, file, vocab, g, err);
    free(text);
    return rc;
}
