/* nn/ops_cpu.h — GPT-2's layers (and the shared cross-entropy), forward and backward, in plain fp32
 * C.
 *
 * These are the reference every GPT-2 kernel of this example is checked against
 * (and what the CPU trainer runs), themselves checked against PyTorch in float64
 * by tests/integration/test_gpt2_ops.sh. Names follow llm.c (train_gpt2.c);
 * the conventions are Hugging Face GPT-2's (Conv1D weights stored (in, out),
 * "gelu_new", qkv packed [q | k | v]).
 *
 * Sizes: B batch, T sequence length, C channels, NH heads (C % NH == 0),
 * V vocabulary, N rows (N = B*T for the per-position layers).
 * Every buffer is a full, contiguous, row-major float (f32) or int32_t array of
 * the shape in its comment, owned by the caller; nothing is allocated, nothing
 * can fail, and arguments are not checked (the caller owns the shapes).
 *
 * Forward functions overwrite their outputs. Backward functions ADD into the
 * gradient buffers (`+=`), so gradients of a parameter used in several places
 * (the tied wte) and of several micro-batches accumulate; the caller zeroes them.
 */
#ifndef NN_OPS_CPU_H
#define NN_OPS_CPU_H

#include <stdint.h>

/* out (B,T,C) = wte[inp[b,t]] + wpe[t]; wte (V,C), wpe (maxT,C) with maxT >= T,
 * inp (B,T) with 0 <= inp < V. */
void nn_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C);

/* dwte (V,C) += dout (B,T,C) at the rows named by inp (B,T); dwpe (maxT,C) += dout
 * summed over the batch, rows 0..T-1. */
void nn_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                         int T, int C);

/* out (N,C) = (inp - mean) * rstd * weight + bias per row of inp (N,C), as
 * torch.nn.LayerNorm (biased variance, eps 1e-5); weight, bias (C). Saves mean (N)
 * and rstd (N) = 1 / sqrt(var + eps) for the backward. */
void nn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);

/* dinp (N,C), dweight (C), dbias (C) += the gradients for dout (N,C), from the
 * forward's inp (N,C), weight (C), mean (N), rstd (N). */
void nn_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C);

/* out (N,OC) = inp (N,IC) x W + bias (OC), bias may be NULL.
 * wt == 0: weight is W (IC,OC) (HF Conv1D: c_attn, c_proj, c_fc store (in, out));
 * wt != 0: weight is W^T (OC,IC) (the LM head tied to wte (V,C)).
 * Sums in double, rounded once to f32. */
void nn_conv1d_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int IC, int OC, int wt);

/* dinp (N,IC), dweight (as weight: (IC,OC) or (OC,IC) by wt), dbias (OC) += the
 * gradients for dout (N,OC), from the forward's inp and weight. Each may be NULL
 * (not wanted: the first layer's input, no bias, or dbias alone: then inp and
 * weight are not read). */
void nn_conv1d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int IC, int OC, int wt);

/* Causal self-attention as HF GPT-2. qkv (B,T,3C) = [q | k | v] along the last
 * dim, each split into NH heads of hs = C/NH channels; scores scaled by
 * 1/sqrt(hs). out (B,T,C) has the heads side by side, as they were in q.
 * Saves preatt (B,NH,T,T), the scaled scores, and att (B,NH,T,T), their softmax
 * over t2 <= t; both are 0 above the diagonal (t2 > t). */
void nn_attention_qkv_forward(float *out, float *preatt, float *att, const float *qkv, int B, int T,
                              int C, int NH);

/* dqkv (B,T,3C) += the gradient for dout (B,T,C), from the forward's qkv and att.
 * dpreatt, datt (B,NH,T,T) are scratch: zeroed here, then hold the gradients
 * w.r.t. preatt and att (0 above the diagonal). */
void nn_attention_qkv_backward(float *dqkv, float *dpreatt, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH);

/* out (N) = GELU(inp (N)), tanh approximation (HF "gelu_new"):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void nn_gelu_forward(float *out, const float *inp, int N);

/* dinp (N) += GELU'(inp (N)) * dout (N). */
void nn_gelu_backward(float *dinp, const float *inp, const float *dout, int N);

/* out (N) = a (N) + b (N); out may be a or b (in place). */
void nn_residual_forward(float *out, const float *a, const float *b, int N);

/* losses (B,T) = -log softmax(logits (B,T,V))[targets (B,T)]; probs (B,T,V), the
 * softmax of every position, saved for the backward. Positions with target < 0
 * are ignored: loss 0 (their probs are still written). */
void nn_crossentropy_forward(float *losses, float *probs, const float *logits,
                             const int32_t *targets, int B, int T, int V);

/* dlogits (B,T,V) += (probs - onehot(target)) * dloss at every position with
 * target >= 0; dloss is the gradient of the total loss w.r.t. each position's
 * loss (1 / the number of counted positions for a mean). */
void nn_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                              float dloss, int B, int T, int V);

#endif
