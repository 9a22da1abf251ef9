/* nn/llama_ops_cpu.c — the Llama family's layers in plain fp32 C (see llama_ops_cpu.h).
 *
 * Layer: nn/ is below every model and uses nothing of libbmt; these functions
 * only compute. They are the reference of the CUDA kernels, so they trade a
 * little speed for accuracy where it is cheap, as nn/ops_cpu.c does:
 *   - every reduction (dot products, means, softmax sums, gradient sums over rows
 *     and heads) accumulates in double from exact f32 x f32 products, and is
 *     rounded to f32 once; `float_lvalue += double_value` rounds once too;
 *   - RoPE's angles t * inv_freq and their cos, sin are taken in double, so a
 *     long sequence loses nothing to the size of t;
 *   - silu is evaluated in double (1 + e^-x is exact enough at both tails).
 * Values stored for the backward (rstd, lse) are f32, as the kernels store them,
 * and the backward uses the stored values.
 *
 * Attention keeps no (T,T) matrix: the forward stores the log-sum-exp of each row
 * of scores, and every pass recomputes a probability as exp(score - lse) when it
 * needs it (the arrangement of flash attention, so the GPU kernels and this
 * reference save the same tensors). The output and gradient sums run over a
 * block of ATT_CHUNK head dimensions at a time in double accumulators on the
 * stack, recomputing the scores per block: one block for hd <= 64, and no
 * allocation for any hd. The backward is two loop nests, dq per query row and
 * dk, dv per key row (summing over the query heads of its group and every later
 * query in double), so no gradient is summed in f32 and nothing is scratch.
 * Its accuracy is that of the saved f32 state, as the kernels': a recomputed
 * probability is off by up to |lse| 2^-24 relative (alike in its row), and
 * D = dout . out (below) by |dout| |out| 2^-24, so a gradient that cancels loses
 * that much against its terms (~1e-5 of the tensor's largest at |lse| < 10).
 *
 * The products are nn/ops_cpu.c's (llm.c's two loop nests: c += a x b read
 * along b's rows, and c += a b^T as dot products of rows), without the bias.
 */
#include <math.h>
#include <stddef.h>

#include "llama_ops_cpu.h"
#include "ops_cpu.h"

/* ---------------------------------------------------------------- RMSNorm */

void nn_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                        int C, float eps)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C; /* (C) */
        float *out_n = out + (size_t)n * C;   /* (C) */
        double ms = 0.0;
        for (int i = 0; i < C; i++) {
            ms += (double)x[i] * x[i];
        }
        ms /= C;
        double s = 1.0 / sqrt(ms + (double)eps);
        for (int i = 0; i < C; i++) {
            out_n[i] = (float)(x[i] * s * weight[i]);
        }
        rstd[n] = (float)s;
    }
}

void nn_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C)
{
    /* dinp, row by row: with norm = x rstd and dnorm = weight dout,
     * dx = rstd (dnorm - norm mean(dnorm norm)) (rstd depends on x through mean(x^2)) */
    for (int n = 0; n < N; n++) {
        const float *dout_n = dout + (size_t)n * C; /* (C) */
        const float *x = inp + (size_t)n * C;       /* (C) */
        float *dinp_n = dinp + (size_t)n * C;       /* (C) */
        double s = rstd[n];
        double dnorm_norm_mean = 0.0;
        for (int i = 0; i < C; i++) {
            dnorm_norm_mean += (double)weight[i] * dout_n[i] * (x[i] * s);
        }
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            double dnorm = (double)weight[i] * dout_n[i];
            dinp_n[i] += (dnorm - x[i] * s * dnorm_norm_mean) * s;
        }
    }
    /* dweight: column by column, so that each sums its N rows in double */
    for (int i = 0; i < C; i++) {
        double dw = 0.0;
        for (int n = 0; n < N; n++) {
            dw += (double)dout[(size_t)n * C + i] * (inp[(size_t)n * C + i] * (double)rstd[n]);
        }
        dweight[i] += dw;
    }
}

/* ---------------------------------------------------------------- RoPE */

void nn_rope_freqs(float *inv_freq, int hd, double theta, const nn_rope_scaling_t *s)
{
    const double two_pi = 6.28318530717958647692;
    for (int i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow(theta, (2.0 * i) / hd);
        if (s != NULL) {
            /* HF _compute_llama3_parameters: the bands are set by the wavelength,
             * compared with the original context over the two factors */
            double orig = s->original_max_position_embeddings;
            double wavelen = two_pi / f;
            if (wavelen < orig / s->high_freq_factor) {
                /* high frequencies: kept */
            } else if (wavelen > orig / s->low_freq_factor) {
                f /= s->factor; /* low frequencies: interpolated by the factor */
            } else {
                double smooth = (orig / wavelen - s->low_freq_factor) /
                                (s->high_freq_factor - s->low_freq_factor);
                f = (1.0 - smooth) * f / s->factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

/* The rotation of every (B, NH) head at each row t by sign * (pos0 + t) * inv_freq;
 * out = rot(inp) (accumulate == 0, out may be inp) or out += rot(inp). The cos
 * and sin of each (t, i) are taken once, for all B * NH heads. */
static void rope_rotate(float *out, const float *inp, const float *inv_freq, int pos0, int B, int T,
                        int NH, int hd, double sign, int accumulate)
{
    int half = hd / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double a = (double)(pos0 + t) * inv_freq[i];
            double c = cos(a), sn = sign * sin(a);
            for (int b = 0; b < B; b++) {
                for (int h = 0; h < NH; h++) {
                    size_t off = (((size_t)b * T + t) * NH + h) * hd + i;
                    double x1 = inp[off], x2 = inp[off + half]; /* read both before writing */
                    double y1 = x1 * c - x2 * sn, y2 = x2 * c + x1 * sn;
                    if (accumulate) {
                        out[off] += y1;
                        out[off + half] += y2;
                    } else {
                        out[off] = (float)y1;
                        out[off + half] = (float)y2;
                    }
                }
            }
        }
    }
}

void nn_rope_forward(float *out, const float *inp, const float *inv_freq, int B, int T, int NH,
                     int hd)
{
    rope_rotate(out, inp, inv_freq, 0, B, T, NH, hd, 1.0, 0);
}

void nn_rope_forward_at(float *out, const float *inp, const float *inv_freq, int pos0, int B, int T,
                        int NH, int hd)
{
    rope_rotate(out, inp, inv_freq, pos0, B, T, NH, hd, 1.0, 0);
}

void nn_rope_backward(float *dinp, const float *dout, const float *inv_freq, int B, int T, int NH,
                      int hd)
{
    /* the rotation by a is orthogonal: its transpose is the rotation by -a */
    rope_rotate(dinp, dout, inv_freq, 0, B, T, NH, hd, -1.0, 1);
}

/* ---------------------------------------------------------------- SwiGLU */

void nn_swiglu_forward(float *out, const float *gate, const float *up, int N)
{
    for (int i = 0; i < N; i++) {
        double g = gate[i];
        out[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
    }
}

void nn_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                        const float *up, int N)
{
    for (int i = 0; i < N; i++) {
        double g = gate[i];
        double sig = 1.0 / (1.0 + exp(-g)); /* e^-g = inf for g << 0: sig = 0, no NaN */
        /* silu'(g) = sig + g sig (1 - sig) */
        dgate[i] += (double)dout[i] * up[i] * (sig * (1.0 + g * (1.0 - sig)));
        dup[i] += (double)dout[i] * (g * sig);
    }
}

/* ---------------------------------------------------------------- attention */

enum {
    ATT_CHUNK = 64 /* head dimensions summed at a time (double accumulators on the stack) */
};

static double dot(const float *a, const float *b, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
    }
    return s;
}

void nn_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          int B, int T, int NH, int NKV, int hd)
{
    size_t q_row = (size_t)NH * hd, kv_row = (size_t)NKV * hd; /* a token's row in q, in k and v */
    int rep = NH / NKV;                                        /* query heads per kv head */
    double scale = 1.0 / sqrt(hd);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float *q_t = q + ((size_t)b * T + t) * q_row + (size_t)h * hd; /* (hd) */
                float *out_t = out + ((size_t)b * T + t) * q_row + (size_t)h * hd;   /* (hd) */
                size_t kv0 = (size_t)b * T * kv_row + (size_t)(h / rep) * hd; /* key 0, head */
                const float *k_h = k + kv0, *v_h = v + kv0; /* key t2: k_h + t2 * kv_row */

                /* the log-sum-exp of the scores t2 <= t, in one pass with a running
                 * maximum m: l = sum exp(s - m), rescaled when m grows */
                double m = -INFINITY, l = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    double s = scale * dot(q_t, k_h + (size_t)t2 * kv_row, hd);
                    if (s > m) {
                        l = l * exp(m - s) + 1.0;
                        m = s;
                    } else {
                        l += exp(s - m);
                    }
                }
                double L = m + log(l);

                /* out = sum p v, p = exp(s - L) <= 1 */
                for (int i0 = 0; i0 < hd; i0 += ATT_CHUNK) {
                    int n = hd - i0 < ATT_CHUNK ? hd - i0 : ATT_CHUNK;
                    double acc[ATT_CHUNK] = { 0 };
                    for (int t2 = 0; t2 <= t; t2++) {
                        double p = exp(scale * dot(q_t, k_h + (size_t)t2 * kv_row, hd) - L);
                        const float *v_t2 = v_h + (size_t)t2 * kv_row + i0;
                        for (int ii = 0; ii < n; ii++) {
                            acc[ii] += p * v_t2[ii];
                        }
                    }
                    for (int ii = 0; ii < n; ii++) {
                        out_t[i0 + ii] = (float)acc[ii];
                    }
                }
                lse[((size_t)b * NH + h) * T + t] = (float)L;
            }
        }
    }
}

void nn_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v, int B,
                           int T, int NH, int NKV, int hd)
{
    /* With p = exp(s - lse) and dp = dout . v_t2, the gradient of the score s is
     * ds = p (dp - D), D = sum_t2 p dp = dout . out (of the query row; the
     * softmax's Jacobian in O(T)). Then dq = scale sum ds k, dk = scale sum ds q,
     * dv = sum p dout. */
    size_t q_row = (size_t)NH * hd, kv_row = (size_t)NKV * hd;
    int rep = NH / NKV;
    double scale = 1.0 / sqrt(hd);

    /* dq: one query row at a time */
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                size_t qoff = ((size_t)b * T + t) * q_row + (size_t)h * hd;
                const float *q_t = q + qoff, *dout_t = dout + qoff; /* (hd) */
                size_t kv0 = (size_t)b * T * kv_row + (size_t)(h / rep) * hd;
                const float *k_h = k + kv0, *v_h = v + kv0;
                double L = lse[((size_t)b * NH + h) * T + t];
                double D = dot(dout_t, out + qoff, hd);
                for (int i0 = 0; i0 < hd; i0 += ATT_CHUNK) {
                    int n = hd - i0 < ATT_CHUNK ? hd - i0 : ATT_CHUNK;
                    double acc[ATT_CHUNK] = { 0 };
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *k_t2 = k_h + (size_t)t2 * kv_row;
                        double p = exp(scale * dot(q_t, k_t2, hd) - L);
                        double ds = p * (dot(dout_t, v_h + (size_t)t2 * kv_row, hd) - D);
                        for (int ii = 0; ii < n; ii++) {
                            acc[ii] += ds * k_t2[i0 + ii];
                        }
                    }
                    for (int ii = 0; ii < n; ii++) {
                        dq[qoff + i0 + ii] += scale * acc[ii];
                    }
                }
            }
        }
    }

    /* dk, dv: one key row at a time, over the query heads of its group and the
     * queries t >= t2 that see it */
    for (int b = 0; b < B; b++) {
        for (int t2 = 0; t2 < T; t2++) {
            for (int g = 0; g < NKV; g++) {
                size_t kvoff = ((size_t)b * T + t2) * kv_row + (size_t)g * hd;
                const float *k_t2 = k + kvoff, *v_t2 = v + kvoff; /* (hd) */
                for (int i0 = 0; i0 < hd; i0 += ATT_CHUNK) {
                    int n = hd - i0 < ATT_CHUNK ? hd - i0 : ATT_CHUNK;
                    double acc_k[ATT_CHUNK] = { 0 }, acc_v[ATT_CHUNK] = { 0 };
                    for (int h = g * rep; h < (g + 1) * rep; h++) {
                        for (int t = t2; t < T; t++) {
                            size_t qoff = ((size_t)b * T + t) * q_row + (size_t)h * hd;
                            const float *q_t = q + qoff, *dout_t = dout + qoff;
                            double L = lse[((size_t)b * NH + h) * T + t];
                            double D = dot(dout_t, out + qoff, hd);
                            double p = exp(scale * dot(q_t, k_t2, hd) - L);
                            double ds = p * (dot(dout_t, v_t2, hd) - D);
                            for (int ii = 0; ii < n; ii++) {
                                acc_k[ii] += ds * q_t[i0 + ii];
                                acc_v[ii] += p * dout_t[i0 + ii];
                            }
                        }
                    }
                    for (int ii = 0; ii < n; ii++) {
                        dk[kvoff + i0 + ii] += scale * acc_k[ii];
                        dv[kvoff + i0 + ii] += acc_v[ii];
                    }
                }
            }
        }
    }
}

void nn_attention_cached(float *out, const float *q, int ldq, const float *kcache,
                         const float *vcache, int pos0, int n, int NH, int NKV, int hd,
                         double *scratch)
{
    const size_t q_row = (size_t)NH * hd, kv_row = (size_t)NKV * hd;
    const int rep = NH / NKV;
    const double scale = 1.0 / sqrt(hd);
    double *s = scratch, *acc = scratch + pos0 + n; /* (pos0 + n) scores, (hd) sums */
    for (int i = 0; i < n; i++) {
        const int P = pos0 + i + 1; /* keys 0..pos0+i */
        for (int h = 0; h < NH; h++) {
            const float *qh = q + (size_t)i * ldq + (size_t)h * hd;
            const float *kh = kcache + (size_t)(h / rep) * hd,
                        *vh = vcache + (size_t)(h / rep) * hd;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < P; j++) {
                s[j] = dot(qh, kh + j * kv_row, hd) * scale;
                m = s[j] > m ? s[j] : m;
            }
            for (int e = 0; e < hd; e++)
                acc[e] = 0;
            for (int j = 0; j < P; j++) {
                const double p = exp(s[j] - m);
                const float *v = vh + j * kv_row;
                sum += p;
                for (int e = 0; e < hd; e++)
                    acc[e] += p * v[e];
            }
            float *o = out + i * q_row + (size_t)h * hd;
            for (int e = 0; e < hd; e++)
                o[e] = (float)(acc[e] / sum);
        }
    }
}

/* ---------------------------------------------------------------- products */

/* nn.Linear without bias is nn/ops_cpu.c's product with the weight stored
 * (OC,IC) and no bias: the same loop nests, the same bits. */
void nn_matmul_forward(float *out, const float *inp, const float *weight, int N, int IC, int OC)
{
    nn_conv1d_forward(out, inp, weight, NULL, N, IC, OC, 1);
}

void nn_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                        const float *weight, int N, int IC, int OC)
{
    nn_conv1d_backward(dinp, dweight, NULL, dout, inp, weight, N, IC, OC, 1);
}
