/* nn/llama_ops_cuda.h — the Llama family's own layers on CUDA: RMSNorm, RoPE
 * and SwiGLU, bf16 activations with f32 sums (nn/llama_ops_cuda.cu).
 *
 * The CUDA twins of nn/llama_ops_cpu.h (the reference, itself checked against
 * float64 PyTorch); tests/gpu/llama_ops_check.c checks each one against its
 * CPU twin on random data with bf16 bounds. The products, the embedding, the
 * flash attention over grouped-query heads and the cross-entropy are the
 * shared ones of nn/ops_cuda.h (nn_cuda_matmul_* with wt = 1 for nn.Linear's
 * (out, in) weights, nn_cuda_encoder_* with wpe NULL, nn_cuda_flash_*,
 * nn_cuda_crossentropy), and every function here runs on that handle's
 * stream (RMSNorm's backward also takes its workspace as scratch).
 *
 * Conventions as nn/ops_cuda.h's: activations and parameters bf16 (void *),
 * every sum f32; gradients of parameters f32 and ADDED into (+=); gradients of
 * activations overwritten (=) unless said; no atomics (fixed order: the same
 * bits every run). Layouts are the ones one product makes when the model
 * stacks its weights:
 *   - qkv (B,T,(NH + 2 NKV) hd): per token, NH query heads, NKV key heads,
 *     NKV value heads (q_proj, k_proj, v_proj stacked: one product);
 *   - gu (N, 2F): per row, gate (F) then up (F) (gate_proj and up_proj
 *     stacked).
 * Functions return 0, or -1 with err (the launch's CUDA error; errors inside a
 * kernel show at the next synchronization). Pointers are device memory.
 */
#ifndef NN_LLAMA_OPS_CUDA_H
#define NN_LLAMA_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/error.h"
#include "nn/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (N,C) bf16 = inp * rstd * weight per row of inp (N,C) bf16, weight (C)
 * bf16; rstd (N) f32 = 1 / sqrt(mean(inp^2) + eps) saved for the backward
 * (nn_rmsnorm_forward's). out may not be inp. C <= 16384, or 8192 where C %
 * 8 != 0 or a pointer is not 16-byte aligned (-1 beyond). */
int nn_cuda_rmsnorm_forward(nn_cuda_t *h, void *out, float *rstd, const void *inp,
                            const void *weight, int N, int C, float eps, bmt_error_t *err);

/* dinp (N,C) bf16 = dres (N,C) bf16 + the input gradient (dres may be dinp:
 * the residual stream's gradient accumulated in place; NULL: 0); dweight (C)
 * f32 += its gradient (= when add is 0: a fresh gradient, bmt_block_call_t's
 * grads_fresh; summed over the rows in a fixed order: partial sums per chunk
 * of rows in the handle's workspace, then per column). From dout (N,C) bf16
 * and the forward's inp, weight, rstd. C as in the forward. */
int nn_cuda_rmsnorm_backward(nn_cuda_t *h, void *dinp, const void *dres, float *dweight,
                             const void *dout, const void *inp, const void *weight,
                             const float *rstd, int N, int C, int add, bmt_error_t *err);

/* RoPE in place on the query and key heads of qkv (the first NH + NKV heads of
 * each token's row; the value heads are not touched): token t of each
 * sequence at position pos0 + t, dims i and i + hd/2 rotated by the angle
 * (pos0 + t) inv_freq[i] (the rotate_half layout, nn_rope_forward's), with
 * the rotation computed in f32 from inv_freq (hd/2) f32 on the device. */
int nn_cuda_rope_forward(nn_cuda_t *h, void *qkv, const float *inv_freq, int B, int T, int NH,
                         int NKV, int hd, int pos0, bmt_error_t *err);

/* The transpose rotation in place on dqkv's query and key heads (the
 * gradient through nn_cuda_rope_forward). */
int nn_cuda_rope_backward(nn_cuda_t *h, void *dqkv, const float *inv_freq, int B, int T, int NH,
                          int NKV, int hd, int pos0, bmt_error_t *err);

/* out (N,F) bf16 = silu(gate) * up, gate and up from gu (N,2F) bf16, silu(x)
 * = x / (1 + e^-x) in f32. */
int nn_cuda_swiglu_forward(nn_cuda_t *h, void *out, const void *gu, int N, int F, bmt_error_t *err);

/* dgu (N,2F) bf16 = the gradients of gate and up for dout (N,F) bf16, from the
 * forward's gu (overwritten; dgu may not be gu). */
int nn_cuda_swiglu_backward(nn_cuda_t *h, void *dgu, const void *dout, const void *gu, int N, int F,
                            bmt_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
