/* nn/llama_ops_cpu.h — the layers of the Llama family, forward and backward, in plain fp32 C.
 *
 * The reference that every Llama kernel is checked against (and what a CPU
 * trainer runs), itself checked against PyTorch in float64 by
 * tests/integration/test_llama_ops.sh. nn/ holds the ops shared by every model
 * (docs/nn.md); a model's example holds only its wiring.
 *
 * The conventions are Hugging Face's LlamaForCausalLM (transformers >= 4.43):
 *   - RMSNorm as LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight, no bias, no
 *     mean subtraction;
 *   - RoPE as LlamaRotaryEmbedding + apply_rotary_pos_emb: inv_freq[i] =
 *     theta^(-2i/hd), the rotate_half layout (dims i and i + hd/2 rotate
 *     together by angle t * inv_freq[i], NOT interleaved pairs (2i, 2i+1)),
 *     positions 0..T-1, and rope_type "llama3" (_compute_llama3_parameters) as
 *     the one scaling;
 *   - the MLP as LlamaMLP: down(silu(gate(x)) * up(x)), the SwiGLU product here;
 *   - attention as LlamaAttention (eager): causal, grouped-query (repeat_kv:
 *     query head h reads kv head h / (NH/NKV)), scores scaled by 1/sqrt(hd);
 *   - every projection an nn.Linear without bias: weight (OC,IC), out = inp W^T.
 *
 * Sizes: B batch, T sequence length, C channels, NH query heads, NKV key/value
 * heads (NH % NKV == 0; NKV == NH is multi-head attention), hd head size (even),
 * N rows (N = B*T for the per-position layers; any count for the elementwise
 * ones), IC/OC a product's input/output channels.
 * Every buffer is a full, contiguous, row-major float (f32) array of the shape in
 * its comment, owned by the caller; nothing is allocated, nothing can fail, and
 * arguments are not checked (the caller owns the shapes).
 *
 * Forward functions overwrite their outputs. Backward functions ADD into the
 * gradient buffers (`+=`), so gradients of several uses and of several
 * micro-batches accumulate; the caller zeroes them.
 */
#ifndef NN_LLAMA_OPS_CPU_H
#define NN_LLAMA_OPS_CPU_H

/* ---------------------------------------------------------------- RMSNorm */

/* out (N,C) = inp * rstd * weight per row of inp (N,C); weight (C). Saves
 * rstd (N) = 1 / sqrt(mean(inp^2) + eps) for the backward (HF: rms_norm_eps,
 * 1e-5 or 1e-6). */
void nn_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                        int C, float eps);

/* dinp (N,C), dweight (C) += the gradients for dout (N,C), from the forward's
 * inp (N,C), weight (C) and rstd (N). */
void nn_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C);

/* ---------------------------------------------------------------- RoPE */

/* Llama 3's frequency scaling (HF rope_scaling with rope_type "llama3"):
 * wavelengths 2 pi / inv_freq shorter than original_max_position_embeddings /
 * high_freq_factor are kept, those longer than original / low_freq_factor are
 * divided by factor, and those between are interpolated smoothly.
 * Llama 3.1: { 8, 1, 4, 8192 }. */
typedef struct nn_rope_scaling {
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings;
} nn_rope_scaling_t;

/* inv_freq (hd/2) = theta^(-2i/hd), i = 0..hd/2-1, then scaled by s (NULL: no
 * scaling). Computed in double, rounded once to f32 (HF keeps inv_freq in f32
 * too, computed in f32). */
void nn_rope_freqs(float *inv_freq, int hd, double theta, const nn_rope_scaling_t *s);

/* out (B,T,NH,hd) = inp (B,T,NH,hd) rotated, each head of the token at position t
 * alike: for i < hd/2, with a = t * inv_freq[i] (inv_freq (hd/2)),
 *   out[i]        = inp[i] cos a - inp[i + hd/2] sin a
 *   out[i + hd/2] = inp[i + hd/2] cos a + inp[i] sin a.
 * Angles and their cos, sin are computed in double (HF takes the angles in f32:
 * at position 8000 off by up to 2.4e-4 rad, half an ulp). out may be inp (in place).
 * NH is any head count: q with NH, k with NKV. */
void nn_rope_forward(float *out, const float *inp, const float *inv_freq, int B, int T, int NH,
                     int hd);

/* The same at positions pos0..pos0+T-1 (pos0 >= 0): row t of each sequence is
 * rotated by the angles of position pos0 + t. A decoder's step rotates the
 * new tokens' q and k at their place after the cached ones;
 * nn_rope_forward is pos0 = 0, the same bits. */
void nn_rope_forward_at(float *out, const float *inp, const float *inv_freq, int pos0, int B, int T,
                        int NH, int hd);

/* dinp (B,T,NH,hd) += dout (B,T,NH,hd) rotated back (by -a: the transpose). */
void nn_rope_backward(float *dinp, const float *dout, const float *inv_freq, int B, int T, int NH,
                      int hd);

/* ---------------------------------------------------------------- SwiGLU */

/* out (N) = silu(gate (N)) * up (N), silu(x) = x / (1 + e^-x). */
void nn_swiglu_forward(float *out, const float *gate, const float *up, int N);

/* dgate (N), dup (N) += the gradients for dout (N), from the forward's gate, up. */
void nn_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                        const float *up, int N);

/* ---------------------------------------------------------------- attention */

/* Causal grouped-query attention. q (B,T,NH,hd), k and v (B,T,NKV,hd), as the
 * projections write them (heads side by side in each token's row); query head h
 * uses kv head h / (NH/NKV). out (B,T,NH,hd) = softmax(q k^T / sqrt(hd), keys
 * t2 <= t) v. Saves lse (B,NH,T), the log-sum-exp of each row of scaled scores;
 * no (T,T) matrix is stored: the backward recomputes the probabilities
 * exp(score - lse) (as flash attention does). */
void nn_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          int B, int T, int NH, int NKV, int hd);

/* dq (B,T,NH,hd), dk and dv (B,T,NKV,hd) += the gradients for dout (B,T,NH,hd),
 * from the forward's out, lse, q, k, v; dk and dv sum over the NH/NKV query heads
 * that share a kv head. */
void nn_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v, int B,
                           int T, int NH, int NKV, int hd);

/* Attention of n new queries over a KV cache (a decoder's step; the CPU twin
 * of nn_cuda_attention_cached of nn/ops_cuda.h). q: n rows ldq >= NH hd apart
 * (so the q part of packed qkv rows can be read where it lies), each NH heads
 * of hd; query i is at position pos0 + i and attends causally to the cache's
 * positions 0 .. pos0 + i: kcache, vcache (>= pos0 + n, NKV, hd), keys after
 * RoPE; query head h reads kv head h / (NH/NKV). out (n, NH hd) =
 * softmax(q k^T / sqrt(hd)) v. Scores, softmax and the weighted sum in double
 * (scores kept, then one pass for the sum); scratch: pos0 + n + hd doubles.
 * bin/generate's CPU decoders run it (checked there against a float64 oracle,
 * tests/integration/test_generate.sh). */
void nn_attention_cached(float *out, const float *q, int ldq, const float *kcache,
                         const float *vcache, int pos0, int n, int NH, int NKV, int hd,
                         double *scratch);

/* ---------------------------------------------------------------- products */

/* out (N,OC) = inp (N,IC) W^T, weight (OC,IC) as nn.Linear stores it, no bias.
 * Sums in double, rounded once to f32. */
void nn_matmul_forward(float *out, const float *inp, const float *weight, int N, int IC, int OC);

/* dinp (N,IC), dweight (OC,IC) += the gradients for dout (N,OC), from the
 * forward's inp and weight. dinp may be NULL (not wanted: a first layer). */
void nn_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                        const float *weight, int N, int IC, int OC);

#endif
