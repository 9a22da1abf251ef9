/* llama/config.h — the Llama family's configuration: HF config.json in and out.
 *
 * A llama_config_t is what the Llama trainer builds a model from. It is read from
 * a Hugging Face `LlamaForCausalLM` (or `MistralForCausalLM` without a sliding
 * window) config.json with LlamaConfig's defaults for absent keys (MistralConfig's
 * for model_type "mistral": F 14336, 8 key/value heads, 131072 positions, and a
 * sliding window of 4096, so that "sliding_window": null must be there), and
 * written back as a config.json that transformers loads unchanged. RoPE's theta
 * and scaling come from rope_theta and rope_scaling, or from transformers 5's
 * rope_parameters (the same values in one object; given both ways, they must
 * agree). Every key whose value the model does not implement is refused with a
 * message naming the key, the value and what is supported: attention or MLP
 * biases, an activation other than SiLU, rope scaling other than Llama 3's, a
 * sliding window, tensor-parallel pretraining slices, dropout.
 *
 * The model (HF's modeling_llama): x = embed(tokens); per layer
 *   x += o_proj(attn(rope(q_proj(rms(x))), rope(k_proj(rms(x))), v_proj(rms(x))))
 *   x += down_proj(silu(gate_proj(rms(x))) * up_proj(rms(x)))
 * logits = lm_head(rms(x)) (lm_head = embed when tied). Attention is causal with
 * n_kv_head key/value heads shared by n_head / n_kv_head query heads each (GQA;
 * n_kv_head == n_head is MHA), head_dim wide, scaled by 1/sqrt(head_dim).
 *
 * Errors: functions return 0 or -1 with err (when not NULL) saying what is wrong
 * in one line that names the file; nothing is changed on failure.
 */
#ifndef LLAMA_CONFIG_H
#define LLAMA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/bmt.h"

#define LLAMA_MAX_EOS 8

typedef struct llama_config {
    int n_layer;     /* num_hidden_layers */
    int n_embd;      /* hidden_size, C */
    int n_head;      /* num_attention_heads */
    int n_kv_head;   /* num_key_value_heads (default: n_head) */
    int head_dim;    /* head_dim (default: n_embd / n_head) */
    int ffn;         /* intermediate_size, F */
    int vocab_size;  /* V */
    int max_seq_len; /* max_position_embeddings */
    double rms_eps;  /* rms_norm_eps */
    double rope_theta;
    /* rope_scaling {"rope_type": "llama3", ...}; rope_llama3 false: none */
    bool rope_llama3;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max; /* original_max_position_embeddings */
    bool tied;             /* tie_word_embeddings */
    int bos_token_id;      /* -1: none */
    int eos_token_ids[LLAMA_MAX_EOS];
    int n_eos;
} llama_config_t;

/* Check the sizes and their relations (every size >= 1 and sane, n_head a
 * multiple of n_kv_head, head_dim even, eps in (0, 1) and theta finite, both at
 * least FLT_MIN, since the layers take them in float32, the Llama 3 scaling's
 * factors as HF requires). */
int llama_config_check(const llama_config_t *c, bmt_error_t *err);

/* Parse config.json text (file names it in messages) into *cfg. */
int llama_config_from_hf_json(const char *text, const char *file, llama_config_t *cfg,
                              bmt_error_t *err);

/* Read path/config.json (path a directory) or the file path itself. */
int llama_config_from_file(const char *path, llama_config_t *cfg, bmt_error_t *err);

/* One layer's tensors (model.layers.N.<name>), in the order the model's blocks
 * add them (model_cuda.h's P_*) and generate reads them (GEN_L_*): the one
 * list of their names and shapes, from cfg. d1 0: one dimension. */
#define LLAMA_LAYER_TENSORS 9
typedef struct llama_tensor_spec {
    const char *name;
    int64_t d0, d1;
} llama_tensor_spec_t;
void llama_layer_tensors(const llama_config_t *c, llama_tensor_spec_t out[LLAMA_LAYER_TENSORS]);

/* Do the safetensors at path (a directory, file or index) hold the model cfg
 * describes: its layers (model.layers.<N>, no more, no fewer) and every tensor
 * the model reads, with the shape cfg gives it? Only the headers are read.
 * Returns 0, or -1 with err naming the tensor. */
int llama_config_check_files(const llama_config_t *c, const char *path, bmt_error_t *err);

/* A config.json for cfg with parameters stored as dtype (f32 or bf16): a
 * malloc'd, newline-terminated string in *json. */
int llama_hf_config_json(const llama_config_t *cfg, bmt_dtype_t dtype, char **json,
                         bmt_error_t *err);

/* Parameters: embedding V C; per layer 2 C (norms) + C (n_head hd) + n_head hd C
 * (q, o) + 2 C (n_kv_head hd) (k, v) + 3 C F; the final norm C; the head V C
 * unless tied. */
int64_t llama_num_params(const llama_config_t *c);

/* FLOPs per token of a training step at sequence length T, as the trainers
 * count them for MFU: 6 N + 6 L (n_head hd) T. */
double llama_flops_per_token(const llama_config_t *c, int T);

#endif
