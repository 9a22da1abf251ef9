/* examples/llama/model.h — the Llama family on libbmt's block list.
 *
 * The model is HF's LlamaForCausalLM (transformers' modeling_llama, eager
 * attention), as llama/config.h describes it: x = embed(tokens); per layer
 *   x += o_proj(attn(rope(q_proj(rms1(x))), rope(k_proj(rms1(x))), v_proj(rms1(x))))
 *   x += down_proj(silu(gate_proj(rms2(x))) * up_proj(rms2(x)))
 * logits = lm_head(norm(x)); loss = mean cross-entropy over targets >= 0.
 * RoPE in the rotate_half layout at positions 0..T-1 (Llama 3's frequency
 * scaling when the config has it), causal grouped-query attention scaled by
 * 1/sqrt(head_dim), no biases anywhere. The layers are nn/llama_ops_cpu.h's.
 *
 * Two compute paths with the same results (within bf16's rounding): on a cpu
 * context, f32 parameters and activations with the plain C layers of
 * nn/llama_ops_cpu.h (the reference); on a cuda context, bf16 parameters (f32
 * master weights in the optimizer, f32 gradients) and bf16 activations with
 * the kernels of nn/ops_cuda.h and nn/llama_ops_cuda.h (model_cuda.c): one
 * product for q, k, v and one for gate, up (over the block's consecutive
 * weights), RoPE in place, grouped-query flash attention, the cross-entropy
 * fused with its gradient. RMSNorm statistics, log-sum-exps and losses are
 * f32 on both.
 *
 * Blocks, each sharded over the group from birth (bmt/block.h), with HF's
 * names, so that a checkpoint the engine writes is a LlamaForCausalLM file:
 *   use 0        "model.embed_tokens": weight (V,C); x_0 = weight[inputs]
 *   uses 1..L    "model.layers.<l>": input_layernorm.weight (C),
 *                self_attn.{q_proj (NH hd, C), k_proj (NKV hd, C), v_proj (NKV hd, C),
 *                o_proj (C, NH hd)}.weight, post_attention_layernorm.weight (C),
 *                mlp.{gate_proj (F,C), up_proj (F,C), down_proj (C,F)}.weight;
 *                x_{l+1} = layer(x_l)
 *   use L+1      "model.norm": weight (C); xf = rms(x_L)
 *   use L+2      "lm_head": weight (V,C), or, when the config ties them,
 *                "model.embed_tokens" again (bmt_blocklist_append_tied);
 *                logits = xf weight^T, and the loss
 * Linear weights are nn.Linear's (out, in). Initialization is HF's
 * _init_weights: N(0, 0.02) for every Linear and the embedding, ones for the
 * RMSNorm weights (which AdamW does not decay: BMT_PARAM_NO_DECAY).
 *
 * The model owns activations: every block's input always (x_0..x_L, xf: what
 * activation checkpointing keeps), and each layer's internals either per layer
 * (checkpointing off) or in one scratch set that a layer's forward fills again
 * inside its backward (checkpointing on). On cuda they are stream-ordered,
 * made and given back during each step (docs/llama.md, CUDA).
 *
 * Errors: functions return 0 (or a pointer) or -1 (or NULL) with err saying
 * what is wrong in one line; nothing is changed on failure.
 */
#ifndef LLAMA_MODEL_H
#define LLAMA_MODEL_H

#include <stdint.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "nn/fp8.h"
#include "llama/config.h"

typedef struct llama_model llama_model_t;

/* Build the blocks (sharded, initialized from seed as HF does), the block list
 * with list_cfg (NULL: the defaults: zero level 3, checkpointing on), and the
 * activations for micro-batches of B sequences of T tokens (1 <= T <=
 * max_seq_len). cfg must pass llama_config_check. f32 parameters on a cpu
 * context, bf16 on a cuda one; there the model is refused (NULL and err naming
 * the size) when its head_dim is not one flash attention takes (16, 32, 64,
 * 128) or when q_proj and k_proj (NH hd C, NKV hd C elements) or gate_proj (F
 * C) are not multiples of BMT_BLOCK_ALIGN, which the stacked products need
 * (hidden_size a multiple of 16 is enough); and on a build without CUDA. Local
 * (no collective), but every rank must build the same model: the list's first
 * forward checks it. */
llama_model_t *llama_model_create(bmt_ctx_t *ctx, const llama_config_t *cfg, int B, int T,
                                  const bmt_blocklist_config_t *list_cfg, uint64_t seed,
                                  bmt_error_t *err);

/* The block list (for bmt_blocklist_forward / _backward, bmt_adamw_create and
 * checkpoints). Owned by the model. */
bmt_blocklist_t *llama_model_list(llama_model_t *m);

/* The configuration the model was built with. */
const llama_config_t *llama_model_config(const llama_model_t *m);

/* The next micro-batch: inputs and targets (B,T) int32, copied. Inputs must be
 * in [0, V); a target < 0 is left out of the loss, one >= V is refused. -1 and
 * err naming the token and its position otherwise (the batch is unchanged). */
int llama_model_set_batch(llama_model_t *m, const int32_t *inputs, const int32_t *targets,
                          bmt_error_t *err);

/* Mean cross-entropy of the last forward over its counted positions (0 when no
 * target counts). On cuda it waits for the compute stream; NaN (and a line on
 * stderr) when the copy fails. */
float llama_model_loss(const llama_model_t *m);

/* Logits of the last forward, (B,T,V) f32 in host memory, owned by the model:
 * valid until the next forward (the backward does not change them). On cuda
 * the head overwrites its logits with their gradient, so ask for them first
 * with llama_model_keep_logits (an (N,V) f32 copy per forward, on the device
 * and the host: a test's view); NULL otherwise (and on a copy error, printed). */
const float *llama_model_logits(const llama_model_t *m);

/* cuda: keep each forward's logits from now on (see llama_model_logits); -1
 * and err when out of memory. No effect on cpu (the logits are kept). */
int llama_model_keep_logits(llama_model_t *m, bmt_error_t *err);

/* Replace the model's parameters with those of an HF Llama checkpoint (before
 * bmt_adamw_create): path is a .safetensors file, a
 * model.safetensors.index.json, or a directory holding one of those
 * (bmt_st_open: model.safetensors when it holds both, as from_pretrained
 * reads it). Every rank reads only the bytes of its own shards
 * (bmt_block_load), converting F32, BF16, F16 or F64 to the parameters' dtype
 * (f32 on cpu, bf16 on cuda). Every parameter
 * must be in the file under its HF name with its shape, and the file's layers
 * (model.layers.<i>) must be exactly the model's L; lm_head.weight is ignored
 * when the model is tied, and tensors the model does not have (e.g. old
 * files' rotary_emb.inv_freq) are ignored. Names, shapes and dtypes are all
 * checked before anything is read, so a mismatch loads nothing. */
int llama_model_load(llama_model_t *m, const char *path, bmt_error_t *err);

/* The dtype of the model's parameters, what a checkpoint's model files hold
 * (llama_hf_config_json's dtype): BMT_F32 on cpu, BMT_BF16 on cuda. */
bmt_dtype_t llama_model_param_dtype(const llama_model_t *m);

/* FP8 (docs/fp8.md): on != 0 computes the layers' four products (q|k|v as
 * one product over the stacked weight [Wq; Wk; Wv], o, gate|up over [Wg; Wu],
 * down) with their operands through FP8, as GPT-2's --fp8 does: activations
 * and weights E4M3, gradients E5M2, each product's operands at their own
 * scales (a stack's weight, input and output gradient one scale each),
 * delayed over `history` passes (1..NN_FP8_HISTORY_MAX; nn_fp8_plan_t) or
 * current (history 0); norms, RoPE, attention, the head and the update as
 * before. The cpu model emulates it exactly in f32 (nn_fp8_linear_*), the
 * cuda model computes it (llama_cu_fp8: nn_cuda_fp8_linear_*), B T, C and F
 * multiples of 16 there (checked against the emulation by
 * tests/gpu/test_llama.sh). Before the first forward. An operand holding NaN or inf
 * makes its product NaN (its row of it, under delayed scaling), so the step
 * is skipped as any non-finite one. Once on, FP8 and its scaling stay (-1
 * with err on a change). */
int llama_model_fp8(llama_model_t *m, int on, int history, bmt_error_t *err);

/* cuda: each product shape's first use times `candidates` of cuBLASLt's
 * heuristic candidates and keeps the fastest (nn_cuda_gemm_tune; 0 or 1: the
 * heuristic's first, the same bits from run to run). -1 with err outside 0..
 * NN_GEMM_TUNE_MAX; no effect on the cpu model. */
int llama_model_gemm_tune(llama_model_t *m, int candidates, bmt_error_t *err);

/* The FP8 scaling's counts so far (nn_fp8_plan_stats, or the cuda model's
 * on the device; the pass in progress closed first); zeros without FP8. 0,
 * or -1 with err (cuda: the download failed). */
int llama_model_fp8_stats(llama_model_t *m, nn_fp8_stats_t *st, bmt_error_t *err);

/* Selective activation checkpointing (the trainer's --ckpt-budget): in a model
 * made with checkpointing, the last `layers` layers keep their activations
 * from the forward to their backward instead of being recomputed, and with
 * `head` the head keeps its logits whole (cuda: the backward then takes its
 * products from them, as without checkpointing, where it recomputes them
 * chunk by chunk); every other layer is recomputed as before. The same
 * numbers either way. Sets each block's bmt_blocklist_set_checkpointing, so
 * before the first forward, on every rank alike. -1 with err: a model without
 * checkpointing, layers outside 0..L, after the first forward, or out of
 * memory (cpu: the sets are allocated here; cuda: as they are used). */
int llama_model_keep_layers(llama_model_t *m, int layers, bool head, bmt_error_t *err);

/* Under checkpointing on cuda, keep each layer's attention output and
 * log-sum-exps from its forward to its backward, so that a recomputation
 * skips the flash forward (mode 1, or -1: the default, on where it applies;
 * 0: off, the least memory): N x NH hd bf16 and B x NH x T f32 more per layer,
 * the same numbers. No effect without checkpointing; on cpu mode 1 is refused
 * (its layers are recomputed whole) and -1 or 0 do nothing. Call it before
 * llama_model_keep_layers (act_bytes counts what it leaves in the sets). */
int llama_model_keep_attention(llama_model_t *m, int mode, bmt_error_t *err);

/* What keeping costs: *layer the bytes of one layer's kept activations (its
 * saved set), *head those the head's whole logits take beyond its chunks (0
 * on cpu, which keeps them whole always). Returns the number of layers. */
int llama_model_act_bytes(const llama_model_t *m, int64_t *layer, int64_t *head);

/* Destroy the list (and its blocks) and the activations. NULL: no-op. */
void llama_model_destroy(llama_model_t *m);

#endif
