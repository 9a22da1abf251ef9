/* examples/llama/model_cuda.h — the CUDA half of model.c (internal).
 *
 * model.c owns the blocks, the list and the host copy of the batch; on a cuda
 * context it hands every callback to these functions, which run the layers of
 * nn/ops_cuda.h and nn/llama_ops_cuda.h on the compute stream with bf16
 * parameters (the list gathers them in bf16; the optimizer keeps f32 masters),
 * bf16 activations and f32 gradients. Built without CUDA, llama_cu_create
 * fails with a clear error and nothing else is reachable.
 *
 * Layer: an example (above libbmt and nn/), as model.c.
 */
#ifndef LLAMA_MODEL_CUDA_H
#define LLAMA_MODEL_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/block.h"
#include "llama/config.h"
#include "nn/fp8.h"

/* The order in which model.c's build_blocks adds a layer's parameters; both
 * halves index call->params and call->grads with it. The CUDA half relies on
 * q, k, v (and gate, up) being consecutive: see llama_cu_create. */
enum {
    P_IN_NORM,   /* input_layernorm.weight (C) */
    P_Q,         /* self_attn.q_proj.weight (NH hd, C) */
    P_K,         /* self_attn.k_proj.weight (NKV hd, C) */
    P_V,         /* self_attn.v_proj.weight (NKV hd, C) */
    P_O,         /* self_attn.o_proj.weight (C, NH hd) */
    P_POST_NORM, /* post_attention_layernorm.weight (C) */
    P_GATE,      /* mlp.gate_proj.weight (F,C) */
    P_UP,        /* mlp.up_proj.weight (F,C) */
    P_DOWN,      /* mlp.down_proj.weight (C,F) */
    P_LAYER_COUNT
};

typedef struct llama_cu llama_cu_t;

/* The handle, RoPE's frequencies (inv_freq: hd/2 f32 on the host, copied to
 * the device), the tokens' device buffers and what lives as long as the model;
 * activations are made during each step (bmt_alloc_async). All counted by
 * bmt_alloc. ckpt: the list checkpoints activations (one scratch set of layer
 * internals, else one per layer).
 * Refused (NULL and err, nothing allocated), because the model computes each
 * layer's q, k, v in one product over q_proj, k_proj and v_proj as they lie
 * back to back in the block's buffer (and gate, up in another):
 *   - a head size flash attention does not take (nn_cuda_flash_ok);
 *   - a stacked matrix whose parts would not be consecutive: the block puts
 *     every parameter at a multiple of BMT_BLOCK_ALIGN elements, so NH hd C,
 *     NKV hd C and F C must be multiples of it (C a multiple of 16 makes them
 *     all so). */
llama_cu_t *llama_cu_create(bmt_ctx_t *ctx, const llama_config_t *cfg, int B, int T, bool ckpt,
                            const float *inv_freq, bmt_error_t *err);
void llama_cu_destroy(llama_cu_t *cu);

/* Selective checkpointing (llama_model_keep_layers): layers keep_from..L-1
 * keep their own activation sets, the others share the scratch set; with
 * head the logits are kept whole. Before the first forward (llama_model_keep_layers checks
 * that on the block list first); -1 only in a build without CUDA. */
int llama_cu_keep_layers(llama_cu_t *cu, int keep_from, bool head, bmt_error_t *err);

/* Bytes of one layer's set, and of the whole logits beyond one chunk's. */
void llama_cu_act_bytes(const llama_cu_t *cu, int64_t *layer, int64_t *head);

/* Under checkpointing, keep each layer's attention output and log-sum-exps
 * from its forward to its backward (mode 1; -1: the default, on; 0: off), so
 * that a recomputation runs the norm, the qkv product and RoPE again but not
 * the flash forward: N x NH hd bf16 and B x NH x T f32 more per layer, the
 * same results. No effect without checkpointing (every layer keeps them). */
int llama_cu_keep_attention(llama_cu_t *cu, int mode, bmt_error_t *err);

/* Copy the batch (host, validated by the caller; counted targets >= 0) to the
 * device, after the work that still reads the previous one. */
int llama_cu_set_batch(llama_cu_t *cu, const int32_t *inputs, const int32_t *targets, int counted,
                       bmt_error_t *err);

/* The callbacks of every use: 0 embeds, 1..L are layers, L+1 is the final
 * norm, L+2 the head. A layer's call whose q, k, v (or gate, up) parameters or
 * gradients are not consecutive is an error (-1 and err), never a wrong
 * product. */
int llama_cu_forward(llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err);
int llama_cu_backward(llama_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err);

/* FP8 (llama_model_fp8, docs/fp8.md): the four products of each layer (q|k|v
 * and gate|up each one product over the stacked weights, o, down) with their
 * operands through FP8 (nn_cuda_fp8_linear_*), delayed over `history` passes
 * or current (0), the bookkeeping of GPT-2's cuda model. Before the first
 * forward; refused (-1 and err) when B T, C or F is not a multiple of 16,
 * and once on it stays, at the same scaling. */
int llama_cu_fp8(llama_cu_t *cu, int on, int history, bmt_error_t *err);

/* nn_cuda_gemm_tune on the handle; -1 and err when it refuses. */
int llama_cu_gemm_tune(llama_cu_t *cu, int candidates, bmt_error_t *err);

/* Its counts so far (the pass in progress closed first, as a forward would). */
int llama_cu_fp8_stats(llama_cu_t *cu, nn_fp8_stats_t *st, bmt_error_t *err);

/* Mean loss of the last forward (waits for the compute stream). */
int llama_cu_loss(llama_cu_t *cu, float *loss, bmt_error_t *err);

/* From now on, keep each forward's logits as f32 (N x V more device memory,
 * and as much host memory); llama_cu_logits then copies the last ones to host
 * memory it owns (valid until the next call). */
int llama_cu_keep_logits(llama_cu_t *cu, bmt_error_t *err);
const float *llama_cu_logits(llama_cu_t *cu, bmt_error_t *err);

#endif
