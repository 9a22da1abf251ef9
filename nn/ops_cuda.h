/* nn/ops_cuda.h — the CUDA layers the models share (GPT-2's, and the products,
 * attention, cross-entropy and reductions of every model), bf16 activations and
 * parameters with f32 accumulation (nn/ops_cuda.cu). They lived in
 * examples/gpt2 until the Llama model came (docs/nn.md).
 *
 * The same layers as ops_cpu.h (the reference), with the same shapes and
 * conventions (HF Conv1D weights (in, out), "gelu_new", qkv packed [q | k | v]);
 * tests/gpu/gpt2_ops_check.c checks each one against its CPU twin on random
 * data with bf16 bounds. What differs, and why:
 *   - Activations and parameters are bf16 ("bf16" below: 2-byte bfloat16, passed
 *     as void *); every sum is f32. Gradients of parameters are f32 (what the
 *     block list hands a backward callback) and are ADDED into (+=), as on the
 *     CPU; gradients of activations are overwritten (=), except where said.
 *   - Matmuls are cuBLASLt (bf16 in, f32 compute; bias fused as an epilogue,
 *     and GELU for the MLP: nn_cuda_matmul_gelu_forward / _backward_dgelu),
 *     with cublasGemmEx as the fallback when cuBLASLt offers no algorithm.
 *   - Attention keeps q, k, v for the backward ("qkvr", 3 N C). GPT-2's head
 *     size runs flash attention (own mma.sync and wgmma kernels,
 *     FlashAttention-2's algorithm) on qkv as it lies; other head sizes
 *     permute to (B,NH,T,hs) and run batched GEMMs over (T,T) scores. The
 *     grouped-query entry points (nn_cuda_flash_*) run the same kernels on
 *     the Llama family's packed rows, head sizes 16 to 128.
 *   - Cross-entropy is fused with its backward: one pass over each row of the
 *     logits gives the loss and overwrites the logits with the gradient, so no
 *     (N,V) f32 buffer exists.
 *   - Every reduction is in a fixed order (no atomics): the same inputs give the
 *     same bits, run after run.
 * All work goes to the handle's stream. Functions return 0, or -1 with a text
 * in err (the CUDA or cuBLAS error of the launch; errors inside a kernel show
 * at the next synchronization). Pointers are device memory unless said.
 */
#ifndef NN_OPS_CUDA_H
#define NN_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/error.h"
#include "nn/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nn_cuda nn_cuda_t;

/* Device bytes of the workspace a handle needs for layers of at most max_cols
 * columns (4C for GPT-2) and N rows: cuBLASLt's workspace plus the partial
 * sums of the column reductions. */
size_t nn_cuda_workspace_bytes(int max_cols);

/* A handle: cuBLAS and cuBLASLt handles bound to stream (a cudaStream_t) on the
 * current device, and the caller's workspace (device memory of
 * nn_cuda_workspace_bytes(max_cols) bytes, which it keeps and frees). */
nn_cuda_t *nn_cuda_create(void *stream, void *workspace, int max_cols, bmt_error_t *err);
void nn_cuda_destroy(nn_cuda_t *h);

/* Attention where flash attention applies (tests and benchmarks): 0 (the
 * default) flash attention, forward and backward for head sizes 64 and 128 through
 * Hopper's wgmma where the build has it (NN_WGMMA: CUDA_ARCH sm_90a) and the
 * device is compute capability 9.0; 1 the materialized scores (`att` and
 * `datt` must then hold B NH T T bf16); 2 flash attention with mma.sync
 * kernels only. */
void nn_cuda_attention_mode(nn_cuda_t *h, int mode);

/* Tests: off 1 takes every bf16 product through cuBLAS (cublasGemmEx) and
 * the epilogues (bias, GELU, residual) through kernels of their own, the
 * path of a shape for which cuBLASLt has no algorithm; 0 (the default) goes
 * back to cuBLASLt. FP8 products always use cuBLASLt. */
void nn_cuda_lt_off(nn_cuda_t *h, int off);

/* The flash kernels mode 0 runs for head sizes 64 and 128 on this handle's
 * device: "wgmma" or "mma.sync" (tests and benchmarks name them; 16 and 32
 * always run mma.sync). */
const char *nn_cuda_attention_kernel(const nn_cuda_t *h);

/* Products keep a cuBLASLt plan per shape (descriptors and algorithm, made on
 * first use). With candidates >= 2, a new shape's plan times that many of
 * cuBLASLt's heuristic candidates on scratch outputs (one warm-up, median of
 * three; the stream is synchronized) and keeps the fastest; 0 or 1 takes the
 * heuristic's first, the same on every run. Timing-based choices can differ
 * between runs, so results are then reproducible only within a run. Drops the
 * plans made so far. -1 (nothing changed) outside [0, NN_GEMM_TUNE_MAX]. */
#define NN_GEMM_TUNE_MAX 32
int nn_cuda_gemm_tune(nn_cuda_t *h, int candidates);

/* out (N,C) bf16 = wte[inp] + wpe[t]; inp (B,T) int32 on the device. wpe
 * NULL: no position embedding (out = wte[inp], the Llama family's). */
int nn_cuda_encoder_forward(nn_cuda_t *h, void *out, const int32_t *inp, const void *wte,
                            const void *wpe, int B, int T, int C, bmt_error_t *err);

/* Token buckets for the encoder's backward, computed on the host from inp (N)
 * with tokens in [0, V): out (3 N + 1 int32) receives
 *   [0, U)          the distinct tokens, ascending,
 *   [U, 2U + 1)     where each token's positions start in the list below,
 *   [2U + 1, +N)    positions sorted by token (stable),
 * and the function returns U. Upload it as is (3 N + 1 int32 at most). */
int nn_token_buckets(const int32_t *inp, int N, int V, int32_t *out);

/* dwte (V,C) f32 += dout rows summed per token (buckets: nn_token_buckets's
 * output, uploaded, with its U); dwpe (maxT,C) f32 += dout summed over the
 * batch, rows 0..T-1 (NULL: no position embedding). dout (B,T,C) bf16. */
int nn_cuda_encoder_backward(nn_cuda_t *h, float *dwte, float *dwpe, const void *dout,
                             const int32_t *buckets, int U, int B, int T, int C, bmt_error_t *err);

/* out (N,C) bf16, mean (N) and rstd (N) f32 from inp (N,C) bf16, weight and
 * bias (C) bf16, as torch.nn.LayerNorm (eps 1e-5). */
int nn_cuda_layernorm_forward(nn_cuda_t *h, void *out, float *mean, float *rstd, const void *inp,
                              const void *weight, const void *bias, int N, int C, bmt_error_t *err);

/* dinp (N,C) bf16 = dres (N,C) bf16 + the input gradient (dres may be dinp:
 * the residual stream's gradient, accumulated in place; NULL: 0); dweight, dbias (C)
 * f32 += theirs (add; = when add is 0: fresh gradients, bmt_block_call_t's
 * grads_fresh). From dout (N,C) bf16 and the forward's inp, weight, mean, rstd. */
int nn_cuda_layernorm_backward(nn_cuda_t *h, void *dinp, const void *dres, float *dweight,
                               float *dbias, const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int N, int C, int add,
                               bmt_error_t *err);

/* out (N,OC) bf16, rows ld_out >= OC apart, = inp (N,IC) x W + bias (OC, or
 * NULL); W is (IC,OC) when wt == 0 (Conv1D), (OC,IC) when wt != 0 (tied head). */
int nn_cuda_matmul_forward(nn_cuda_t *h, void *out, int ld_out, const void *inp, const void *weight,
                           const void *bias, int N, int IC, int OC, int wt, bmt_error_t *err);

/* out (N,OC) bf16 = res (N,OC) bf16 + inp x W + bias (OC, or NULL) in one
 * product: cuBLASLt reads res as its C input (beta 1), so the residual add
 * is no separate pass and the sum is rounded to bf16 once (after it, in
 * f32). Rows OC apart; out may be res (in place: cuBLASLt may then take
 * another kernel, so the bits may differ from out != res, within bf16's
 * rounding); W as in nn_cuda_matmul_forward. */
int nn_cuda_matmul_residual_forward(nn_cuda_t *h, void *out, const void *res, const void *inp,
                                    const void *weight, const void *bias, int N, int IC, int OC,
                                    int wt, bmt_error_t *err);

/* The MLP's first product with GELU fused into cuBLASLt's epilogue (W Conv1D,
 * rows OC apart): out (N,OC) bf16 = GELU_tanh(x), pre (N,OC) bf16 = x, with x =
 * inp x W + bias taken in f32 (pre is what the backward reads). */
int nn_cuda_matmul_gelu_forward(nn_cuda_t *h, void *out, void *pre, const void *inp,
                                const void *weight, const void *bias, int N, int IC, int OC,
                                bmt_error_t *err);

/* From dout (N,OC) bf16 with rows ld_dout apart: dinp (N,IC) bf16 = dout x W^T
 * (overwritten; NULL: not wanted), dweight (shaped as W) f32 += (NULL: not
 * wanted, and inp is not read), dbias (OC) f32 += (NULL: no bias); with add
 * 0, dweight and dbias = instead of += (fresh gradients, bmt_block_call_t's
 * grads_fresh: the weight's product with beta 0, no read of what they held).
 * inp and weight as in the forward. Taking dweight and dinp in two calls lets
 * a caller free inp before dinp exists. */
int nn_cuda_matmul_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                            const void *dout, int ld_dout, const void *inp, const void *weight,
                            int N, int IC, int OC, int wt, int add, bmt_error_t *err);

/* The same for W Conv1D with the GELU's backward fused into dinp's product:
 * dinp (N,IC) bf16 = (dout x W^T) * GELU_tanh'(pre), pre (N,IC) the
 * pre-activation of nn_cuda_matmul_gelu_forward; dweight, dbias and add as above. */
int nn_cuda_matmul_backward_dgelu(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                  const void *dout, int ld_dout, const void *inp,
                                  const void *weight, const void *pre, int N, int IC, int OC,
                                  int add, bmt_error_t *err);

/* FP8 product (docs/fp8.md): out (N,OC) = a (N,K) x b (OC,K)^T x *a_descale x
 * *b_descale [+ bias (OC) bf16] [+ beta out], from FP8 codes (nn/fp8.h) with
 * the reduced dimension K contiguous in both operands (nn_cuda_fp8_quantize
 * writes either layout of a tensor), f32 sums; out bf16 (out_f32 0) or f32
 * (out_f32 1, no bias: the weight gradients, beta 1 to add into them), rows
 * ld_out apart. The descales are device f32 (nn_cuda_fp8_scale's). ka x kb:
 * E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3. fast_accum != 0 lets the tensor
 * cores keep partial sums in their own reduced precision (cuBLASLt's
 * FAST_ACCUM): faster, less accurate (the forward's choice, not the
 * backward's). Refused with a message: other kinds, K not a multiple of 16,
 * pointers (the descales too) not 16-byte aligned, rows not 16-byte
 * multiples. */
int nn_cuda_fp8_matmul(nn_cuda_t *h, void *out, int out_f32, int ld_out, const uint8_t *a,
                       nn_fp8_kind_t ka, const float *a_descale, const uint8_t *b, nn_fp8_kind_t kb,
                       const float *b_descale, const void *bias, float beta, int fast_accum, int N,
                       int K, int OC, bmt_error_t *err);

/* out (N,OC) bf16 = res (N,OC) bf16 + the product above (bf16 output, rows
 * OC apart) + bias: cuBLASLt's C input with beta 1, the sum rounded once
 * (nn_cuda_matmul_residual_forward's FP8 twin). res 16-byte aligned; NULL
 * and res == out are refused (in place, cuBLASLt's FP8 product gave other
 * bits than into a buffer of its own: measured on an H100). */
int nn_cuda_fp8_matmul_residual(nn_cuda_t *h, void *out, const void *res, const uint8_t *a,
                                nn_fp8_kind_t ka, const float *a_descale, const uint8_t *b,
                                nn_fp8_kind_t kb, const float *b_descale, const void *bias,
                                int fast_accum, int N, int K, int OC, bmt_error_t *err);

/* Causal self-attention. Head sizes 16, 32 and 64 (GPT-2's is 64) take
 * flash attention (the scores never reach memory; `att` saves the softmax's
 * log-sum-exp per row, (B,NH,T) f32); other head sizes materialize the scores
 * (`att` saves the softmax itself, (B,NH,T,T) bf16, 0 above the diagonal).
 * nn_cuda_attention_saved_bytes gives the size of `att` and of the backward's
 * `datt` scratch either way. */
int nn_cuda_attention_is_flash(int C, int NH);
size_t nn_cuda_attention_saved_bytes(int B, int T, int C, int NH);

/* From qkv (B,T,3C) bf16: qkvr and att are saved for the backward; out (B,T,C)
 * bf16. Flash attention reads the heads where they lie: qkvr is qkv's copy in
 * the same layout (qkvr may be qkv: nothing is copied) and scratch is unused
 * (may be NULL). The materialized path saves qkvr as 3 x (B,NH,T,hs) (qkvr must
 * not be qkv) and uses scratch: N C bf16. */
int nn_cuda_attention_forward(nn_cuda_t *h, void *out, void *qkvr, void *att, const void *qkv,
                              void *scratch, int B, int T, int C, int NH, bmt_error_t *err);

/* dqkv (B,T,3C) bf16 = the gradient for dout (B,T,C) bf16, from the forward's
 * out, qkvr and att. datt: saved_bytes of scratch. scratch: 4 N C bf16 for the
 * materialized path; unused (may be NULL) by flash attention, which writes
 * dq, dk and dv where they lie in dqkv. */
int nn_cuda_attention_backward(nn_cuda_t *h, void *dqkv, const void *dout, const void *out,
                               const void *qkvr, const void *att, void *datt, void *scratch, int B,
                               int T, int C, int NH, bmt_error_t *err);

/* Flash attention over grouped-query heads (GQA; NKV == NH is multi-head), the
 * Llama family's layout: qkv (B,T,(NH + 2 NKV) hd) bf16, each token's row
 * holding its NH query heads, then NKV key heads, then NKV value heads (the
 * output of one product with q_proj, k_proj and v_proj stacked); query head h
 * reads kv head h / (NH / NKV), K and V are never replicated. Causal, scale
 * 1/sqrt(hd). Head sizes nn_cuda_flash_ok says yes to (16, 32, 64, 128);
 * NH % NKV == 0. out (B,T,NH hd) bf16; lse (B,NH,T) f32 is saved for the
 * backward (the log-sum-exp of each row of scaled scores, as the CPU twin
 * nn_attention_forward of nn/llama_ops_cpu.h saves it). With NKV == NH and hd
 * 64 this is exactly the kernel nn_cuda_attention_forward runs for GPT-2. */
int nn_cuda_flash_ok(int hd);
int nn_cuda_flash_forward(nn_cuda_t *h, void *out, float *lse, const void *qkv, int B, int T,
                          int NH, int NKV, int hd, bmt_error_t *err);

/* dqkv (B,T,(NH + 2 NKV) hd) bf16 = the gradient for dout (B,T,NH hd) bf16
 * (overwritten; dk and dv summed over the query heads of their group, in a
 * fixed order), from the forward's out, qkv and lse. Dd: scratch of B NH T
 * f32. */
int nn_cuda_flash_backward(nn_cuda_t *h, void *dqkv, float *Dd, const void *dout, const void *out,
                           const void *qkv, const float *lse, int B, int T, int NH, int NKV, int hd,
                           bmt_error_t *err);

/* Attention of n new queries over a KV cache, a decoder's step (bin/generate's
 * CUDA decoder; the CPU twin is nn_attention_cached of nn/llama_ops_cpu.h).
 *   q       n rows ldq >= NH hd elements apart (bf16), each NH heads of hd:
 *           the q part of packed qkv rows is read where it lies;
 *   kcache, vcache  (>= pos0 + n, NKV, hd) bf16: keys (after RoPE) and values
 *           of positions 0.., the n new ones included (the caller copies them
 *           in first);
 *   out     (n, NH hd) bf16, dense.
 * Query i is at position pos0 + i and attends causally to positions
 * 0..pos0 + i; query head h reads kv head h / (NH / NKV); scores scaled by
 * 1/sqrt(hd). Scores, softmax and the weighted sum are f32: one block of 4
 * warps per (query, head), each warp an online softmax over every 4th key,
 * the warps combined in a fixed order (no atomics: the same bits every run).
 * Bound by reading the cache once per query head; meant for decoding, where n
 * is 1 or a prompt's chunk (flash attention is the training path).
 * -1 and err for hd outside 1..256, NH not a multiple of NKV, n NH >= 2^31,
 * ldq < NH hd; n 0 does nothing. */
int nn_cuda_attention_cached(nn_cuda_t *h, void *out, const void *q, int ldq, const void *kcache,
                             const void *vcache, int pos0, int n, int NH, int NKV, int hd,
                             bmt_error_t *err);

/* out (n) bf16 = GELU_tanh(inp (n) bf16); out may be inp. */
int nn_cuda_gelu_forward(nn_cuda_t *h, void *out, const void *inp, size_t n, bmt_error_t *err);

/* dinp (n) bf16 = GELU'(inp) * dout (overwritten; dinp may be dout). */
int nn_cuda_gelu_backward(nn_cuda_t *h, void *dinp, const void *inp, const void *dout, size_t n,
                          bmt_error_t *err);

/* out (n) bf16 = a + b; out may be a or b. */
int nn_cuda_residual_forward(nn_cuda_t *h, void *out, const void *a, const void *b, size_t n,
                             bmt_error_t *err);

/* Fused softmax cross-entropy and its backward, per row of logits (N rows of V
 * bf16, ld apart, ld >= V): losses (N) f32 = -log softmax(row)[target] (0 where
 * target < 0); when dloss != 0, the row is then overwritten with
 * (softmax - onehot(target)) * dloss (0 where target < 0), and columns V..ld-1
 * with 0. targets (N) int32 on the device. */
int nn_cuda_crossentropy(nn_cuda_t *h, float *losses, void *logits, int ld, const int32_t *targets,
                         float dloss, int N, int V, bmt_error_t *err);

/* *out (one f32, device) = sum of x (n f32), in a fixed order. */
int nn_cuda_sum(nn_cuda_t *h, float *out, const float *x, int n, bmt_error_t *err);

/* dst (n) f32 = src (n, rows of `cols` bf16 with ld apart) — a (rows, cols)
 * view cast to f32 densely (cols per row). */
int nn_cuda_to_f32(nn_cuda_t *h, float *dst, const void *src, int rows, int cols, int ld,
                   bmt_error_t *err);

/* The handle's stream (a cudaStream_t), for the layers of other files
 * (nn/llama_ops_cuda.cu) that run on it. */
void *nn_cuda_stream(nn_cuda_t *h);

/* The handle's workspace (device memory, *bytes = nn_cuda_workspace_bytes of
 * the handle's max_cols, at least 32 MiB): scratch that every function on the
 * handle's stream may overwrite, cuBLASLt's included, so it holds nothing
 * between calls (stream order keeps one call's use from another's). */
void *nn_cuda_workspace(nn_cuda_t *h, size_t *bytes);

#ifdef __cplusplus
}
#endif
#endif
