/* tests/unit/test_llama_config.c — the Llama family's config.json in and out.
 *
 * Published config.json files (Llama 3.2 1B, TinyLlama 1.1B, SmolLM 135M,
 * Mistral 7B v0.3, Llama 3.1 8B Instruct's list of end tokens) parse to the
 * sizes they state, with LlamaConfig's defaults where keys are absent; the
 * parameter counts equal the published ones; what the writer produces parses
 * back to the same configuration; and every value the model does not compute,
 * and every malformed one, is refused with a message naming the key and the
 * file, leaving the output untouched.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama/config.h"
#include "tap.h"

static const char *LLAMA32_1B =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":128000,\"eos_token_id\":128001,\"head_dim\":64,\"hidden_act\":\"silu\","
    "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":8192,"
    "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,"
    "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,"
    "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
    "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":true,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.45.0.dev0\",\"use_cache\":true,"
    "\"vocab_size\":128256}";

static const char *TINYLLAMA =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"bos_token_id\":1,\"eos_token_id\":2,"
    "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,"
    "\"intermediate_size\":5632,\"max_position_embeddings\":2048,\"model_type\":\"llama\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":22,\"num_key_value_heads\":4,"
    "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":null,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\","
    "\"transformers_version\":\"4.31.0.dev0\",\"use_cache\":true,\"vocab_size\":32000}";

static const char *SMOLLM =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"bos_token_id\":0,"
    "\"eos_token_id\":0,\"hidden_act\":\"silu\",\"hidden_size\":576,\"initializer_range\":0.02,"
    "\"intermediate_size\":1536,\"max_position_embeddings\":2048,\"model_type\":\"llama\","
    "\"num_attention_heads\":9,\"num_hidden_layers\":30,\"num_key_value_heads\":3,"
    "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":null,\"rope_theta\":10000.0,"
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\",\"use_cache\":true,"
    "\"vocab_size\":49152}";

static const char *MISTRAL =
    "{\"architectures\":[\"MistralForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":1,"
    "\"eos_token_id\":2,\"hidden_act\":\"silu\",\"hidden_size\":4096,\"initializer_range\":0.02,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":32768,\"model_type\":\"mistral\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,\"sliding_window\":null,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"use_cache\":true,"
    "\"vocab_size\":32768}";

static void check_published(void)
{
    llama_config_t c;
    bmt_error_t err = { { 0 } };
    ok(llama_config_from_hf_json(LLAMA32_1B, "l.json", &c, &err) == 0, "Llama 3.2 1B parses");
    ok(c.n_layer == 16 && c.n_embd == 2048 && c.n_head == 32 && c.n_kv_head == 8 &&
           c.head_dim == 64 && c.ffn == 8192 && c.vocab_size == 128256 && c.max_seq_len == 131072 &&
           c.rms_eps == 1e-5 && c.rope_theta == 500000 && c.tied,
       "Llama 3.2 1B: sizes, eps, theta, tied");
    ok(c.rope_llama3 && c.rope_factor == 32 && c.rope_low_freq_factor == 1 &&
           c.rope_high_freq_factor == 4 && c.rope_original_max == 8192,
       "Llama 3.2 1B: Llama 3 rope scaling");
    ok(c.bos_token_id == 128000 && c.n_eos == 1 && c.eos_token_ids[0] == 128001,
       "Llama 3.2 1B: bos 128000, eos 128001");
    is_int((int)(llama_num_params(&c) - 1235814400LL), 0, "Llama 3.2 1B: 1,235,814,400 parameters");

    ok(llama_config_from_hf_json(TINYLLAMA, "t.json", &c, &err) == 0 && c.n_kv_head == 4 &&
           c.head_dim == 64 && !c.tied && !c.rope_llama3 && c.rope_theta == 10000,
       "TinyLlama: GQA 8:1, theta absent = 10000, untied");
    is_int((int)(llama_num_params(&c) - 1100048384LL), 0, "TinyLlama: 1,100,048,384 parameters");
    ok(llama_config_from_hf_json(SMOLLM, "s.json", &c, &err) == 0 && c.n_head == 9 &&
           c.n_kv_head == 3 && c.head_dim == 64 && c.tied,
       "SmolLM 135M: 9 heads of 64, 3 KV heads, tied");
    is_int((int)(llama_num_params(&c) - 134515008LL), 0, "SmolLM 135M: 134,515,008 parameters");
    ok(llama_config_from_hf_json(MISTRAL, "m.json", &c, &err) == 0 && c.head_dim == 128 &&
           c.max_seq_len == 32768,
       "Mistral 7B v0.3 (sliding_window null) parses");
    is_int((int)(llama_num_params(&c) - 7248023552LL), 0, "Mistral 7B v0.3: 7,248,023,552");
    double f = llama_flops_per_token(&c, 4096);
    ok(f == 6.0 * 7248023552.0 + 6.0 * 32 * 4096 * 4096, "flops per token: 6 N + 6 L (H hd) T");

    ok(llama_config_from_hf_json("{\"vocab_size\":128256,\"eos_token_id\":[128001,128008,128009]}",
                                 "e.json", &c, &err) == 0 &&
           c.n_eos == 3 && c.eos_token_ids[2] == 128009,
       "eos_token_id as a list (Llama 3.1 Instruct)");
    ok(llama_config_from_hf_json("{}", "d.json", &c, &err) == 0 && c.vocab_size == 32000 &&
           c.n_embd == 4096 && c.ffn == 11008 && c.n_layer == 32 && c.n_head == 32 &&
           c.n_kv_head == 32 && c.head_dim == 128 && c.max_seq_len == 2048 && c.rms_eps == 1e-6 &&
           c.rope_theta == 10000 && !c.tied && c.bos_token_id == -1 && c.n_eos == 0,
       "an empty object is LlamaConfig's defaults");
    ok(llama_config_from_hf_json("{\"num_key_value_heads\":null,\"head_dim\":null,"
                                 "\"num_attention_heads\":8,\"hidden_size\":512}",
                                 "n.json", &c, &err) == 0 &&
           c.n_kv_head == 8 && c.head_dim == 64,
       "null num_key_value_heads and head_dim take the defaults");
    /* transformers 5 writes rope_theta and the scaling as one rope_parameters
     * object: the same model as the older keys. */
    llama_config_t v4, v5;
    const char *LLAMA32_1B_V5 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"bos_token_id\":128000,\"eos_token_id\":128001,"
        "\"head_dim\":64,\"hidden_size\":2048,\"intermediate_size\":8192,"
        "\"max_position_embeddings\":131072,\"model_type\":\"llama\",\"num_attention_heads\":32,"
        "\"num_hidden_layers\":16,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,"
        "\"rope_parameters\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_theta\":500000.0,"
        "\"rope_type\":\"llama3\"},\"tie_word_embeddings\":true,\"vocab_size\":128256}";
    ok(llama_config_from_hf_json(LLAMA32_1B, "4.json", &v4, &err) == 0 &&
           llama_config_from_hf_json(LLAMA32_1B_V5, "5.json", &v5, &err) == 0 &&
           memcmp(&v4, &v5, sizeof(v4)) == 0,
       "Llama 3.2 1B as transformers 5 writes it (rope_parameters): the same configuration");
    ok(llama_config_from_hf_json("{\"rope_parameters\":{\"rope_type\":\"default\","
                                 "\"rope_theta\":1000000.0},\"rope_scaling\":null}",
                                 "5.json", &c, &err) == 0 &&
           c.rope_theta == 1e6 && !c.rope_llama3,
       "rope_parameters of the default type: its rope_theta");
    ok(llama_config_from_hf_json("{\"rope_parameters\":{\"rope_theta\":5e5},\"rope_theta\":5e5}",
                                 "5.json", &c, &err) == 0 &&
           c.rope_theta == 5e5 && !c.rope_llama3,
       "rope_parameters without a type is the default (and an equal rope_theta beside it)");
    ok(llama_config_from_hf_json(
           "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1,"
           "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192},\"rope_theta\":5e5,"
           "\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1,"
           "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192,\"rope_theta\":5e5}}",
           "5.json", &c, &err) == 0 &&
           c.rope_llama3 && c.rope_factor == 32 && c.rope_theta == 5e5,
       "rope_scaling and rope_parameters that agree (rope_theta only in the second) are read");

    /* A "mistral" config.json is a MistralConfig in from_pretrained: its
     * defaults, not LlamaConfig's, fill the absent keys. */
    ok(llama_config_from_hf_json("{\"model_type\":\"mistral\",\"sliding_window\":null}", "m.json",
                                 &c, &err) == 0 &&
           c.ffn == 14336 && c.n_kv_head == 8 && c.max_seq_len == 131072 && c.n_head == 32 &&
           c.head_dim == 128,
       "absent keys of a mistral config are MistralConfig's defaults (F 14336, 8 kv heads, "
       "131072 positions)");
    ok(llama_config_from_hf_json("{\"model_type\":\"mistral\",\"sliding_window\":null,"
                                 "\"num_key_value_heads\":null}",
                                 "m.json", &c, &err) == 0 &&
           c.n_kv_head == 32,
       "a mistral config's null num_key_value_heads is the heads (MistralConfig)");
}

static void check_round_trip(void)
{
    const char *cases[] = { LLAMA32_1B, TINYLLAMA, SMOLLM, MISTRAL };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        llama_config_t a, b;
        char *json = NULL;
        bmt_error_t err = { { 0 } };
        int rc = llama_config_from_hf_json(cases[i], "in.json", &a, &err);
        rc = rc ? rc : llama_hf_config_json(&a, i % 2 ? BMT_F32 : BMT_BF16, &json, &err);
        rc = rc ? rc : llama_config_from_hf_json(json, "out.json", &b, &err);
        ok(rc == 0 && memcmp(&a, &b, sizeof(a)) == 0, "config %zu: written, read back the same", i);
        json_t *j = json ? json_loads(json, 0, NULL) : NULL;
        ok(j && strcmp(json_string_value(json_object_get(j, "model_type")), "llama") == 0 &&
               strcmp(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                      "LlamaForCausalLM") == 0 &&
               strcmp(json_string_value(json_object_get(j, "torch_dtype")),
                      i % 2 ? "float32" : "bfloat16") == 0 &&
               json_is_false(json_object_get(j, "attention_bias")) &&
               json_integer_value(json_object_get(j, "head_dim")) == a.head_dim &&
               json_is_boolean(json_object_get(j, "tie_word_embeddings")) && json &&
               json[strlen(json) - 1] == '\n',
           "config %zu: the keys transformers reads, newline-terminated", i);
        json_decref(j);
        free(json);
    }
    llama_config_t c;
    llama_config_from_hf_json(TINYLLAMA, "t.json", &c, NULL);
    char *json = (char *)"untouched";
    bmt_error_t err = { { 0 } };
    ok(llama_hf_config_json(&c, BMT_F64, &json, &err) == -1 && strcmp(json, "untouched") == 0 &&
           strstr(err.text, "only f32 and bf16"),
       "config.json for f64 parameters refused");
    c.n_kv_head = 5;
    ok(llama_hf_config_json(&c, BMT_F32, &json, &err) == -1 &&
           strstr(err.text, "not a multiple of num_key_value_heads 5"),
       "an inconsistent configuration is not written");
}

static void check_refused(void)
{
    static const struct {
        const char *json, *want;
    } bad[] = {
        { "[1]", "x.json: malformed: a JSON object is needed, not an array" },
        { "{\"a\":", "x.json: not valid JSON" },
        { "{\"a\":1,\"a\":2}", "x.json: not valid JSON" },
        { "{\"model_type\":\"gpt2\"}", "x.json: model_type is \"gpt2\"; supported: \"llama\"" },
        { "{\"architectures\":[\"GPT2LMHeadModel\"]}", "architectures[] is \"GPT2LMHeadModel\"" },
        { "{\"hidden_act\":\"gelu\"}", "hidden_act is \"gelu\"; supported: \"silu\"" },
        { "{\"attention_bias\":true}", "attention_bias is true; supported: false" },
        { "{\"mlp_bias\":true}", "mlp_bias is true" },
        { "{\"pretraining_tp\":2}", "pretraining_tp is 2" },
        { "{\"attention_dropout\":0.1}", "attention_dropout is 0.1" },
        { "{\"model_type\":\"mistral\",\"sliding_window\":4096}", "sliding_window is 4096" },
        { "{\"model_type\":\"mistral\",\"max_position_embeddings\":32768}",
          "sliding_window is absent, which MistralConfig takes as 4096" },
        { "{\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}",
          "rope_scaling.rope_type is \"linear\"; supported: \"llama3\"" },
        { "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}", "is \"yarn\"" },
        { "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0}}",
          "rope_scaling llama3 needs a number \"low_freq_factor\"" },
        { "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":4,"
          "\"high_freq_factor\":1,\"original_max_position_embeddings\":8192}}",
          "0 < low_freq_factor < high_freq_factor" },
        { "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"type\":\"linear\"}}",
          "\"type\" and \"rope_type\" differ" },
        { "{\"rope_scaling\":5}", "\"rope_scaling\" must be an object or null, not an integer" },
        { "{\"hidden_size\":\"4096\"}", "\"hidden_size\" must be an integer, not a string" },
        { "{\"hidden_size\":0}", "hidden_size is 0; it must be 1 to" },
        { "{\"num_attention_heads\":32,\"num_key_value_heads\":5}",
          "num_attention_heads 32 is not a multiple of num_key_value_heads 5" },
        { "{\"hidden_size\":100,\"num_attention_heads\":3}",
          "hidden_size 100 is not a multiple of num_attention_heads 3 and head_dim is absent" },
        { "{\"head_dim\":63,\"num_attention_heads\":2,\"hidden_size\":126}", "head_dim 63 is odd" },
        { "{\"rms_norm_eps\":0}", "rms_norm_eps 0 must be in (0, 1)" },
        { "{\"rms_norm_eps\":\"1e-5\"}", "\"rms_norm_eps\" must be a number" },
        { "{\"rope_theta\":-1}", "rope_theta -1 must be a positive number" },
        /* below FLT_MIN the float32 layers see an eps of 0 (a row of zeros:
         * 0 * inf = NaN) or frequencies up to 1/theta past FLT_MAX (inf) */
        { "{\"rms_norm_eps\":1e-50}",
          "rms_norm_eps 1e-50 must be in (0, 1) and at least 1.17549e-38" },
        { "{\"rope_theta\":1e-40}",
          "rope_theta 1e-40 must be a positive number of at least 1.17549e-38" },
        { "{\"tie_word_embeddings\":1}", "\"tie_word_embeddings\" must be true or false" },
        { "{\"eos_token_id\":40000}", "eos_token_id 40000 is outside the vocabulary of 32000" },
        { "{\"bos_token_id\":[1,2]}", "\"bos_token_id\" must be an integer or null" },
        { "{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", "lists 9 tokens; at most 8" },
        { "{\"eos_token_id\":[1,\"x\"]}", "eos_token_id[1] must be a token id" },
        { "{\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"rope_theta\":1e4}}",
          "rope_parameters.rope_type is \"yarn\"; supported: \"llama3\"" },
        { "{\"rope_theta\":10000,\"rope_parameters\":{\"rope_type\":\"default\","
          "\"rope_theta\":500000}}",
          "rope_theta is 10000 but rope_parameters.rope_theta is 500000" },
        { "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1,"
          "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192},"
          "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1}}",
          "rope_scaling and rope_parameters are both given and describe different scalings" },
        { "{\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\","
          "\"rope_theta\":1}}}",
          "not one per layer type" },
        { "{\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.5}}",
          "rope_parameters.partial_rotary_factor is 0.5" },
        { "{\"rope_parameters\":5}", "\"rope_parameters\" must be an object or null" },
        { "{\"rope_parameters\":{\"rope_theta\":\"1e4\"}}",
          "\"rope_parameters.rope_theta\" must be a number" },
        { "{\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8.0}}",
          "rope_parameters llama3 needs a number \"low_freq_factor\"" },
        { "{\"partial_rotary_factor\":0.5}", "partial_rotary_factor is 0.5" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        llama_config_t c;
        memset(&c, 0x5a, sizeof(c));
        llama_config_t before = c;
        bmt_error_t err = { { 0 } };
        int rc = llama_config_from_hf_json(bad[i].json, "x.json", &c, &err);
        ok(rc == -1 && strstr(err.text, bad[i].want) && strncmp(err.text, "x.json: ", 8) == 0 &&
               memcmp(&c, &before, sizeof(c)) == 0,
           "refused, file named, output untouched: %s", bad[i].json);
        if (rc != -1 || !strstr(err.text, bad[i].want))
            diag("rc %d: '%s', want '%s'", rc, err.text, bad[i].want);
    }
    llama_config_t c;
    ok(llama_config_from_hf_json("{\"rms_norm_eps\":1.2e-38,\"rope_theta\":1.2e-38}", "x.json", &c,
                                 NULL) == 0 &&
           c.rms_eps == 1.2e-38 && c.rope_theta == 1.2e-38,
       "rms_norm_eps and rope_theta just above FLT_MIN are taken");
    ok(llama_config_from_hf_json("{}", "x.json", &c, NULL) == 0 &&
           llama_config_from_hf_json("{\"hidden_act\":\"gelu\"}", "x.json", &c, NULL) == -1,
       "a NULL error pointer is allowed");
    bmt_error_t err = { { 0 } };
    ok(llama_config_from_file("/nonexistent-dir-xyz", &c, &err) == -1 &&
           strstr(err.text, "config.json: no such file"),
       "a directory without config.json is named");
}

int main(void)
{
    check_published();
    check_round_trip();
    check_refused();
    return done_testing();
}
