/* examples/gpt2/model_cuda.h — the CUDA half of model.c (internal).
 *
 * model.c owns the blocks, the list and the host copy of the batch; on a cuda
 * context it hands every callback to these functions, which run the layers of
 * nn/ops_cuda.h on the compute stream with bf16 parameters (the list gathers them
 * in bf16; the optimizer keeps f32 masters) and bf16 activations. Built
 * without CUDA, gpt2_cu_create fails with a clear error and nothing else is
 * reachable.
 */
#ifndef GPT2_MODEL_CUDA_H
#define GPT2_MODEL_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/block.h"
#include "gpt2/model.h"
#include "nn/fp8.h"

typedef struct gpt2_cu gpt2_cu_t;

/* Activations for micro-batches of B x T (one scratch set of layer internals
 * when ckpt, one per layer otherwise), the tokens' device copies and the
 * handle; all counted by bmt_alloc. */
gpt2_cu_t *gpt2_cu_create(bmt_ctx_t *ctx, const gpt2_config_t *cfg, int B, int T, bool ckpt,
                          bmt_error_t *err);
void gpt2_cu_destroy(gpt2_cu_t *cu);

/* Copy the batch (host, validated by the caller; counted targets >= 0) to the
 * device, after the work that still reads the previous one. */
int gpt2_cu_set_batch(gpt2_cu_t *cu, const int32_t *inputs, const int32_t *targets, int counted,
                      bmt_error_t *err);

/* The callbacks of every use: 0 embeds, 1..L are layers, L+1 is the head. */
int gpt2_cu_forward(gpt2_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err);
int gpt2_cu_backward(gpt2_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err);

/* Mean loss of the last forward (waits for the compute stream). */
int gpt2_cu_loss(gpt2_cu_t *cu, float *loss, bmt_error_t *err);

/* From now on, keep each forward's logits as f32 (N x V more device memory);
 * gpt2_cu_logits then copies the last ones to host memory it owns. */
int gpt2_cu_keep_logits(gpt2_cu_t *cu, bmt_error_t *err);
const float *gpt2_cu_logits(gpt2_cu_t *cu, bmt_error_t *err);

/* Under checkpointing, keep each layer's attention output and log-sum-exp
 * from its forward to its backward, so that the recomputation skips the
 * attention. mode 1: on (flash attention only: -1 and err otherwise); 0: off;
 * -1: on with flash attention, else off. No effect without checkpointing.
 * Call it between micro-batches, not between a forward and its backward. */
int gpt2_cu_keep_attention(gpt2_cu_t *cu, int mode, bmt_error_t *err);

/* Selective checkpointing (gpt2_model_keep_layers): layers keep_from..L-1
 * keep their own activation sets, the others share the scratch set; with
 * head the logits are kept whole. Before the first forward (gpt2_model_keep_layers checks
 * that on the block list first); -1 only in a build without CUDA. */
int gpt2_cu_keep_layers(gpt2_cu_t *cu, int keep_from, bool head, bmt_error_t *err);

/* Bytes of one kept layer's set (as keep_attn and FP8 stand now), and of the
 * whole logits beyond one chunk's. */
void gpt2_cu_act_bytes(const gpt2_cu_t *cu, int64_t *layer, int64_t *head);

/* on != 0: the four products of each layer with FP8 operands from the next
 * forward on (nn_cuda_fp8_conv1d_*, docs/fp8.md); their scales and scratch
 * are made here. history 0: current scaling; 1..NN_FP8_HISTORY_MAX: delayed
 * scaling over that many passes (nn_cuda_fp8_advance at each forward that
 * follows a backward; the first pass current). Call it before the first
 * forward; -1 and err when B T or the width is not a multiple of 16, history
 * is out of range, or to turn it off or change its history. */
int gpt2_cu_fp8(gpt2_cu_t *cu, int on, int history, bmt_error_t *err);

/* What the FP8 scales' records said so far (nn_fp8_stats_t; waits for the
 * stream). All 0 without FP8. */
int gpt2_cu_fp8_stats(gpt2_cu_t *cu, nn_fp8_stats_t *st, bmt_error_t *err);

/* nn_cuda_gemm_tune on the handle; -1 and err when it refuses. */
int gpt2_cu_gemm_tune(gpt2_cu_t *cu, int candidates, bmt_error_t *err);

#endif
