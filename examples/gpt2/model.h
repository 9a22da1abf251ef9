/* examples/gpt2/model.h — GPT-2 on libbmt's block list.
 *
 * Two compute paths with the same results: on a cpu context, f32 parameters
 * and activations with the plain C layers of ops_cpu.c (the reference); on a
 * cuda context, bf16 parameters (f32 master weights in the optimizer, f32
 * gradients) and bf16 activations with the kernels of nn/ops_cuda.cu
 * (model_cuda.c).
 *
 * The model is HF's GPT2LMHeadModel: token and position embeddings,
 * pre-LayerNorm blocks (causal multi-head self-attention, GELU-tanh MLP), a
 * final LayerNorm, and the LM head tied to the token embedding; mean
 * cross-entropy loss. Parameters carry HF's names and shapes
 * ("transformer.h.3.attn.c_attn.weight" is (C, 3C), Conv1D's (in, out)).
 *
 * Blocks, each sharded over the group from birth (bmt/block.h):
 *   use 0        "transformer": wte (V,C), wpe (maxT,C), ln_f.weight (C), ln_f.bias (C)
 *                as the embedding: x0 = wte[inputs] + wpe[t]
 *   uses 1..L    "transformer.h.<l>": one transformer layer, x_{l+1} = layer(x_l)
 *   use L+1      "transformer" again (bmt_blocklist_append_tied) as the head:
 *                logits = ln_f(x_L) wte^T, loss = mean cross-entropy
 * The model owns activations: the residual stream x_0..x_L (B,T,C) always (the
 * blocks' inputs, what activation checkpointing keeps), and each layer's
 * internals either per layer (checkpointing off) or in one scratch set that a
 * layer's forward fills again inside backward (checkpointing on).
 */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <stdint.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "nn/fp8.h"

typedef struct gpt2_config {
    int max_seq_len; /* maxT: rows of wpe */
    int vocab_size;  /* V */
    int n_layer;     /* L */
    int n_head;      /* NH */
    int n_embd;      /* C, a multiple of NH */
} gpt2_config_t;

/* Named sizes: "tiny" (byte-level demo: V 256, maxT 256, L 4, NH 4, C 64), "d12"
 * (124M: V 50257, maxT 1024, L 12, NH 12, C 768), "d24" (350M: 24, 16, 1024),
 * "d36" (774M: 36, 20, 1280), "d48" (1558M: 48, 25, 1600). -1 and err for an
 * unknown name. */
int gpt2_config_by_name(const char *name, gpt2_config_t *cfg, bmt_error_t *err);

/* 0, or -1 with err saying which size is wrong (non-positive, C not a multiple
 * of NH, too large). */
int gpt2_config_check(const gpt2_config_t *cfg, bmt_error_t *err);

/* Parameters of the model (the tied wte counted once). */
int64_t gpt2_num_params(const gpt2_config_t *cfg);

/* Model FLOPs of one token, forward and backward, at sequence length T, as
 * llm.c counts them: 6 N + 6 L C T (no recomputation). */
double gpt2_flops_per_token(const gpt2_config_t *cfg, int T);

typedef struct gpt2_model gpt2_model_t;

/* Build the blocks (sharded, initialized from seed as GPT-2 does: weights
 * N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 L)), biases 0,
 * LayerNorm weights 1), the block list with list_cfg (NULL: defaults), and the
 * activations for micro-batches of B sequences of T tokens (T <= maxT), on the
 * context's device: f32 parameters on cpu, bf16 on cuda. */
gpt2_model_t *gpt2_model_create(bmt_ctx_t *ctx, const gpt2_config_t *cfg, int B, int T,
                                const bmt_blocklist_config_t *list_cfg, uint64_t seed,
                                bmt_error_t *err);

/* The block list (for bmt_blocklist_forward / _backward and bmt_adamw_create). */
bmt_blocklist_t *gpt2_model_list(gpt2_model_t *m);

/* The next micro-batch: inputs and targets (B,T) int32, copied. Tokens must be
 * in [0, V); a target < 0 is left out of the loss. -1 and err otherwise. */
int gpt2_model_set_batch(gpt2_model_t *m, const int32_t *inputs, const int32_t *targets,
                         bmt_error_t *err);

/* Mean loss of the last forward over its counted positions. */
float gpt2_model_loss(const gpt2_model_t *m);

/* Logits of the last forward, (B,T,V) f32 in host memory. On cuda the head
 * overwrites its logits with their gradient, so ask for them first with
 * gpt2_model_keep_logits (an (N,V) f32 copy per forward; a test's view); NULL
 * otherwise (and on a copy error, printed). */
const float *gpt2_model_logits(const gpt2_model_t *m);
int gpt2_model_keep_logits(gpt2_model_t *m, bmt_error_t *err);

/* cuda, under activation checkpointing: keep each layer's attention output
 * and log-sum-exp from its forward to its backward (N C bf16 and B H T f32
 * per layer), so that the recomputation skips the attention forward; the same
 * bits. Flash attention only (head size 16, 32, 64). No effect without
 * checkpointing. mode 1: on, -1 and err on cpu and for other head sizes;
 * 0: off; -1: on where it applies (cuda with flash attention), else off. */
int gpt2_model_keep_attention(gpt2_model_t *m, int mode, bmt_error_t *err);

/* cuda: the products time `candidates` cuBLASLt algorithms per shape at first
 * use and keep the fastest (nn_cuda_gemm_tune; 0 or 1: the heuristic's
 * first). No effect on cpu. -1 and err outside [0, NN_GEMM_TUNE_MAX (32)]. */
int gpt2_model_gemm_tune(gpt2_model_t *m, int candidates, bmt_error_t *err);

/* FP8 (docs/fp8.md): on != 0 computes the layers' four products with their
 * operands in FP8 (activations and weights E4M3, gradients E5M2, one scale
 * per tensor), the head, norms, attention and update as before. history 0:
 * current scaling (each tensor's scale from its own amax); 1..1024
 * (NN_FP8_HISTORY_MAX): delayed scaling, each tensor's scale from the
 * largest amax its conversions recorded in the last `history` passes (a pass
 * is a micro-batch's forward and backward; the first pass current), the
 * bookkeeping of nn_fp8_plan_t. The cpu model emulates it exactly in f32
 * (nn/fp8.h: the reference of the GPU's FP8 mode); the cuda model runs it
 * through cuBLASLt's FP8 products (nn_cuda_fp8_conv1d_*) and refuses it (-1
 * with err) when B x T or the width is not a multiple of 16. Call it before
 * the first step; turning it off or changing history later is refused. An
 * operand that holds NaN or infinite values makes its product's results NaN,
 * so the step is skipped as any non-finite one
 * (bmt_adamw_config_t.max_skipped). */
int gpt2_model_fp8(gpt2_model_t *m, int on, int history, bmt_error_t *err);

/* What FP8's scale records said so far (nn_fp8_stats_t: passes closed,
 * operand-passes saturated or unscalable); all 0 without FP8. It closes a
 * pass whose backward ended first, as the next forward would: call it when
 * the training is done. On cuda it waits for the stream. */
int gpt2_model_fp8_stats(gpt2_model_t *m, nn_fp8_stats_t *st, bmt_error_t *err);

/* The sizes of the GPT-2 in a safetensors file, index or directory (HF names,
 * with or without the "transformer." prefix), found by block discovery: L from
 * the layers, V and C from wte, maxT from wpe. The heads:
 *   - with a config.json beside the weights (in the directory given, or in the
 *     directory of the file or index given): that file decides, through
 *     gpt2_config_from_hf_json: n_head from it (n_head here may be 0, or must
 *     equal it), its sizes must equal the weights', and any value the trainer
 *     does not compute is refused;
 *   - without one: n_head, or C / 64 when n_head is 0 (GPT-2's head size).
 * -1 and err naming the file and what is missing, inconsistent or
 * unsupported; *cfg is written only on success. */
int gpt2_config_from_file(const char *path, int n_head, gpt2_config_t *cfg, bmt_error_t *err);

/* The LayerNorm epsilon of every LayerNorm the trainer computes (ops_cpu.c,
 * nn/ops_cuda.cu); HF's layer_norm_epsilon. */
#define GPT2_LAYERNORM_EPS 1e-5

/* Check an HF GPT2Config (config.json's text, NUL-terminated) against the
 * model this trainer computes, and take its heads. Pure: no I/O.
 *   cfg:    in, the sizes found in the weights (n_head is ignored); out, on
 *           success, the same with n_head from the config.
 *   n_head: 0, or the heads the caller was given (--heads), which must equal
 *           the config's.
 *   file:   the name errors use.
 * Absent keys take GPT2Config's defaults, as from_pretrained does (n_head 12,
 * n_layer 12, ..., activation gelu_new, epsilon 1e-5, tied head). Refused,
 * naming the field, its value and what is supported: n_layer, n_embd,
 * vocab_size, n_positions (or their aliases num_hidden_layers, hidden_size,
 * max_position_embeddings) other than the weights'; model_type other than
 * "gpt2"; architectures other than GPT2LMHeadModel, GPT2Model;
 * activation_function other than gelu_new or gelu_pytorch_tanh (the same GELU,
 * tanh approximation); layer_norm_epsilon other than GPT2_LAYERNORM_EPS
 * (relative 1e-9); tie_word_embeddings false; scale_attn_weights false;
 * scale_attn_by_inverse_layer_idx true; add_cross_attention true; n_inner
 * other than null or 4 n_embd; non-empty pruned_heads; rotary position keys
 * (rotary_dim, rope_theta, rope_scaling, rotary_pct, rope_parameters) with a
 * value. Accepted although the trainer does not do it: reorder_and_upcast_attn
 * true (HF then scales the keys before the product and takes the scores and
 * softmax in f32: the same function, only rounding differs, and our kernels
 * already take them in f32), and dropout probabilities (training-time noise,
 * not the model's function; the trainer has no dropout and writes 0; each
 * must be a number in [0, 1]). Other keys are HF's business (token ids,
 * torch_dtype, summary_*, ...) and not read. Text that is not a JSON object,
 * a key given twice, or a key above of the wrong JSON type is an error naming
 * the file ("malformed" or "not valid JSON"). */
int gpt2_config_from_hf_json(const char *text, const char *file, int n_head, gpt2_config_t *cfg,
                             bmt_error_t *err);

/* The text of an HF GPT2Config (a checkpoint's config.json) describing exactly
 * the model this trainer computes, so that
 * transformers.GPT2LMHeadModel.from_pretrained(dir) builds it unchanged:
 * model_type gpt2, architectures [GPT2LMHeadModel], the sizes (n_positions and
 * n_ctx = maxT), n_inner null (4 C), activation gelu_new (GELU, tanh),
 * layer_norm_epsilon GPT2_LAYERNORM_EPS, tied embeddings, attention scaled by
 * 1/sqrt(head size) only, no cross-attention, dropouts 0, bos/eos 50256 when
 * V >= 50257 (GPT-2's tokenizer) and null otherwise (left out, GPT2Config
 * makes them 50256, outside the vocabulary, and transformers 5 warns about it
 * at every load), and torch_dtype from
 * dtype (what the checkpoint's model files hold: BMT_F32 "float32" or BMT_BF16
 * "bfloat16"). gpt2_config_from_hf_json accepts it. *json: malloc'd,
 * NUL-terminated, ending in a newline; the caller frees it. -1 and err (*json
 * untouched) for a cfg that fails gpt2_config_check, another dtype, or out of
 * memory. */
int gpt2_hf_config_json(const gpt2_config_t *cfg, bmt_dtype_t dtype, char **json, bmt_error_t *err);

/* Replace the model's parameters with those of a safetensors file (before
 * bmt_adamw_create): every rank reads only the bytes of its own shards
 * (bmt_block_load), converting to f32. Every parameter must be in the file with
 * its shape ("transformer.h.0.attn.c_attn.weight" or "h.0.attn.c_attn.weight",
 * (C, 3C) as HF's Conv1D stores it); the file's attention-mask buffers
 * (attn.bias, attn.masked_bias) and lm_head.weight (tied to wte) are ignored.
 * Names and shapes are all checked before anything is read. */
int gpt2_model_load(gpt2_model_t *m, const char *path, bmt_error_t *err);

/* The dtype of the model's parameters, what a checkpoint's model files hold:
 * BMT_F32 on cpu, BMT_BF16 on cuda (gpt2_hf_config_json's dtype). */
bmt_dtype_t gpt2_model_param_dtype(const gpt2_model_t *m);

/* Destroy the list (and its blocks) and the activations. NULL: no-op. */
/* Selective activation checkpointing (the trainer's --ckpt-budget), as
 * llama_model_keep_layers: in a model made with checkpointing, the last
 * `layers` layers keep their activations (not recomputed), and with `head`
 * the head keeps its logits whole (cuda); the same numbers. Before the first
 * forward, on every rank alike. -1 with err: no checkpointing, layers outside
 * 0..L, after the first forward, out of memory. */
int gpt2_model_keep_layers(gpt2_model_t *m, int layers, bool head, bmt_error_t *err);

/* *layer: the bytes of one layer's kept activations; *head: those of the
 * whole logits beyond one chunk's (0 on cpu). Returns the number of layers. */
int gpt2_model_act_bytes(const gpt2_model_t *m, int64_t *layer, int64_t *head);

void gpt2_model_destroy(gpt2_model_t *m);

#endif
