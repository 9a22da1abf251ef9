/* nn/ops_cpu.c — GPT-2's layers in plain fp32 C (see ops_cpu.h).
 *
 * Written after llm.c's train_gpt2.c, one function per layer and pass, without
 * OpenMP. These are the reference of the CUDA kernels, so they trade a little
 * speed for accuracy where it is cheap:
 *   - every reduction (dot products, means, softmax sums, gradient sums over rows)
 *     accumulates in double, multiplying f32 values exactly in double, and is
 *     rounded to f32 once; `float_lvalue += double_value` rounds once too (C
 *     computes it in double);
 *   - softmaxes subtract the row maximum before expf, and the cross-entropy loss
 *     is log(sum) - (logit - max), exact even where the target's probability
 *     underflows;
 *   - GELU is evaluated in double: in f32, 1 + tanh(u) cancels for x << 0.
 * Values stored for the backward (mean, rstd, preatt, att, probs) are f32, as the
 * kernels store them, and the backward uses the stored values.
 *
 * The matmuls are the only hot loops (the CPU trainer runs small models in tests
 * under a time budget). All six products of the forward and backward reduce to
 * two loop nests: mm_rows (c += a x b with b read along its rows: a tile of
 * output rows times a tile of columns, so the inner loop is contiguous and
 * vectorizes) and mm_dots (c += a b^T: dot products of rows, two at a time in
 * eight partial sums each, over a block of b's rows that stays in cache while
 * every row of a passes). Both reach about 2-3.5 GMAC/s on one x86-64 core at -O2.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "nn/ops_cpu.h"

/* ---------------------------------------------------------------- encoder */

void nn_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;          /* (C) */
            const float *wte_ix = wte + (size_t)inp[b * T + t] * C; /* (C) */
            const float *wpe_t = wpe + (size_t)t * C;               /* (C) */
            for (int i = 0; i < C; i++) {
                out_bt[i] = wte_ix[i] + wpe_t[i];
            }
        }
    }
}

void nn_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                         int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            float *dwte_ix = dwte + (size_t)inp[b * T + t] * C;
            float *dwpe_t = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                dwte_ix[i] += dout_bt[i];
                dwpe_t[i] += dout_bt[i];
            }
        }
    }
}

/* ---------------------------------------------------------------- layernorm */

void nn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C)
{
    const double eps = 1e-5;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C; /* (C) */
        float *out_n = out + (size_t)n * C;   /* (C) */
        double m = 0.0;
        for (int i = 0; i < C; i++) {
            m += x[i];
        }
        m /= C;
        /* two passes: the variance as the mean of squared deviations, which does
         * not cancel the way E[x^2] - m^2 does */
        double v = 0.0;
        for (int i = 0; i < C; i++) {
            double d = x[i] - m;
            v += d * d;
        }
        v /= C;
        double s = 1.0 / sqrt(v + eps);
        for (int i = 0; i < C; i++) {
            out_n[i] = (float)((x[i] - m) * s * weight[i] + bias[i]);
        }
        mean[n] = (float)m;
        rstd[n] = (float)s;
    }
}

void nn_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C)
{
    /* dinp, row by row: with norm = (x - mean) rstd and dnorm = weight dout,
     * dx = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)) */
    for (int n = 0; n < N; n++) {
        const float *dout_n = dout + (size_t)n * C; /* (C) */
        const float *x = inp + (size_t)n * C;       /* (C) */
        float *dinp_n = dinp + (size_t)n * C;       /* (C) */
        double m = mean[n], s = rstd[n];
        double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
        for (int i = 0; i < C; i++) {
            double norm = (x[i] - m) * s;
            double dnorm = (double)weight[i] * dout_n[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            double norm = (x[i] - m) * s;
            double dnorm = (double)weight[i] * dout_n[i];
            dinp_n[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    /* dweight, dbias: column by column, so that each sums its N rows in double */
    for (int i = 0; i < C; i++) {
        double dw = 0.0, db = 0.0;
        for (int n = 0; n < N; n++) {
            double d = dout[(size_t)n * C + i];
            dw += d * ((inp[(size_t)n * C + i] - (double)mean[n]) * rstd[n]);
            db += d;
        }
        dweight[i] += dw;
        dbias[i] += db;
    }
}

/* ---------------------------------------------------------------- matmul */

enum {
    MM_ROWS = 4,       /* mm_rows: output rows per tile */
    MM_COLS = 64,      /* mm_rows: output columns per tile (its double sums: 2 KiB) */
    MM_DOT_BLOCK = 64, /* mm_dots: rows of b kept in cache while all of a passes */
    MM_LANES = 8       /* mm_dots: partial sums per dot product */
};

/* c (M,J) = [c +] a (M,K) x b (K,J) [+ bias (J)], b row-major; element (m,k) of a
 * is a[m * a_sm + k * a_sk], so a may be read transposed (a_sm = 1).
 * accumulate != 0 adds to c (bias must then be NULL). */
static void mm_rows(float *c, const float *a, size_t a_sm, size_t a_sk, const float *b,
                    const float *bias, int M, int K, int J, int accumulate)
{
    double acc[MM_ROWS][MM_COLS];
    for (int m0 = 0; m0 < M; m0 += MM_ROWS) {
        int nm = M - m0 < MM_ROWS ? M - m0 : MM_ROWS;
        for (int j0 = 0; j0 < J; j0 += MM_COLS) {
            int nj = J - j0 < MM_COLS ? J - j0 : MM_COLS;
            for (int r = 0; r < nm; r++) {
                const float *c_r = c + (size_t)(m0 + r) * J + j0;
                for (int jj = 0; jj < nj; jj++) {
                    acc[r][jj] = accumulate ? c_r[jj] : bias != NULL ? bias[j0 + jj] : 0.0f;
                }
            }
            for (int k = 0; k < K; k++) {
                const float *b_k = b + (size_t)k * J + j0; /* (nj) */
                for (int r = 0; r < nm; r++) {
                    double a_rk = a[(size_t)(m0 + r) * a_sm + (size_t)k * a_sk];
                    double *acc_r = acc[r];
                    if (nj == MM_COLS) {
                        /* the same loop with a constant trip count, which gcc -O2 vectorizes */
                        for (int jj = 0; jj < MM_COLS; jj++) {
                            acc_r[jj] += a_rk * b_k[jj];
                        }
                    } else {
                        for (int jj = 0; jj < nj; jj++) {
                            acc_r[jj] += a_rk * b_k[jj];
                        }
                    }
                }
            }
            for (int r = 0; r < nm; r++) {
                float *c_r = c + (size_t)(m0 + r) * J + j0;
                for (int jj = 0; jj < nj; jj++) {
                    c_r[jj] = (float)acc[r][jj];
                }
            }
        }
    }
}

/* c (M,J) = [c +] a (M,K) b (J,K)^T [+ bias (J)], a and b row-major.
 * accumulate != 0 adds to c (bias must then be NULL). */
static void mm_dots(float *c, const float *a, const float *b, const float *bias, int M, int K,
                    int J, int accumulate)
{
    for (int j0 = 0; j0 < J; j0 += MM_DOT_BLOCK) {
        int j1 = J - j0 < MM_DOT_BLOCK ? J : j0 + MM_DOT_BLOCK;
        for (int m = 0; m < M; m++) {
            const float *a_m = a + (size_t)m * K; /* (K) */
            float *c_m = c + (size_t)m * J;       /* (J) */
            for (int j = j0; j < j1; j += 2) {
                /* two rows of b at a time (the last one twice when j1 - j0 is odd), each
                 * summed in MM_LANES partial sums: independent sums that gcc vectorizes */
                int nb = j + 1 < j1 ? 2 : 1;
                const float *b0 = b + (size_t)j * K;     /* (K) */
                const float *b1 = nb == 2 ? b0 + K : b0; /* (K) */
                double s0[MM_LANES] = { 0 }, s1[MM_LANES] = { 0 };
                int k = 0;
                for (; k + MM_LANES <= K; k += MM_LANES) {
                    for (int l = 0; l < MM_LANES; l++) {
                        double x = a_m[k + l];
                        s0[l] += x * b0[k + l];
                        s1[l] += x * b1[k + l];
                    }
                }
                double sum[2] = { 0.0, 0.0 };
                for (; k < K; k++) {
                    sum[0] += (double)a_m[k] * b0[k];
                    sum[1] += (double)a_m[k] * b1[k];
                }
                for (int l = 0; l < MM_LANES; l++) {
                    sum[0] += s0[l];
                    sum[1] += s1[l];
                }
                for (int q = 0; q < nb; q++) {
                    double base = accumulate ? c_m[j + q] : bias != NULL ? bias[j + q] : 0.0f;
                    c_m[j + q] = (float)(base + sum[q]);
                }
            }
        }
    }
}

void nn_conv1d_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int IC, int OC, int wt)
{
    if (wt == 0) {
        mm_rows(out, inp, (size_t)IC, 1, weight, bias, N, IC, OC, 0); /* inp (N,IC) x W (IC,OC) */
    } else {
        mm_dots(out, inp, weight, bias, N, IC, OC, 0); /* inp (N,IC) . W^T, weight (OC,IC) */
    }
}

void nn_conv1d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int IC, int OC, int wt)
{
    if (wt == 0) {
        /* weight is W (IC,OC): dinp (N,IC) += dout (N,OC) . W^T;
         * dW (IC,OC) += inp^T (IC,N) x dout (N,OC) */
        if (dinp != NULL) {
            mm_dots(dinp, dout, weight, NULL, N, OC, IC, 1);
        }
        if (dweight != NULL) {
            mm_rows(dweight, inp, 1, (size_t)IC, dout, NULL, IC, N, OC, 1);
        }
    } else {
        /* weight is W^T (OC,IC): dinp (N,IC) += dout (N,OC) x W^T (OC,IC);
         * dW^T (OC,IC) += dout^T (OC,N) x inp (N,IC) */
        if (dinp != NULL) {
            mm_rows(dinp, dout, (size_t)OC, 1, weight, NULL, N, OC, IC, 1);
        }
        if (dweight != NULL) {
            mm_rows(dweight, dout, 1, (size_t)OC, inp, NULL, OC, N, IC, 1);
        }
    }
    if (dbias != NULL) {
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int n = 0; n < N; n++) {
                s += dout[(size_t)n * OC + o];
            }
            dbias[o] += s;
        }
    }
}

/* ---------------------------------------------------------------- attention */

void nn_attention_qkv_forward(float *out, float *preatt, float *att, const float *qkv, int B, int T,
                              int C, int NH)
{
    size_t C3 = 3 * (size_t)C;
    int hs = C / NH; /* head size */
    double scale = 1.0 / sqrt(hs);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float *query_t = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs; /* (hs) */
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                float *preatt_bth = preatt + row; /* (T) */
                float *att_bth = att + row;       /* (T) */

                /* scores of the keys t2 <= t, and their maximum */
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *key_t2 = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    double dot = 0.0;
                    for (int i = 0; i < hs; i++) {
                        dot += (double)query_t[i] * key_t2[i];
                    }
                    preatt_bth[t2] = (float)(dot * scale);
                    maxval = fmaxf(maxval, preatt_bth[t2]);
                }
                /* softmax; subtracting the maximum keeps expf finite (the sum is >= 1) */
                double expsum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    att_bth[t2] = expf(preatt_bth[t2] - maxval);
                    expsum += att_bth[t2];
                }
                double expsum_inv = 1.0 / expsum;
                for (int t2 = 0; t2 <= t; t2++) {
                    att_bth[t2] = (float)(att_bth[t2] * expsum_inv);
                }
                /* the causal mask: defined zeros, so that kernels and tests can compare whole rows
                 */
                for (int t2 = t + 1; t2 < T; t2++) {
                    preatt_bth[t2] = 0.0f;
                    att_bth[t2] = 0.0f;
                }

                /* out = att . values */
                float *out_bth = out + ((size_t)b * T + t) * C + (size_t)h * hs; /* (hs) */
                for (int i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *value_t2 = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C;
                        o += (double)att_bth[t2] * value_t2[(size_t)h * hs + i];
                    }
                    out_bth[i] = (float)o;
                }
            }
        }
    }
}

void nn_attention_qkv_backward(float *dqkv, float *dpreatt, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH)
{
    size_t C3 = 3 * (size_t)C;
    int hs = C / NH;
    double scale = 1.0 / sqrt(hs);
    memset(dpreatt, 0, (size_t)B * NH * T * T * sizeof *dpreatt);
    memset(datt, 0, (size_t)B * NH * T * T * sizeof *datt);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                const float *att_bth = att + row; /* (T) */
                float *datt_bth = datt + row;     /* (T) */
                float *dpreatt_bth = dpreatt + row;
                size_t qoff = ((size_t)b * T + t) * C3 + (size_t)h * hs;
                const float *query_t = qkv + qoff;                                       /* (hs) */
                float *dquery_t = dqkv + qoff;                                           /* (hs) */
                const float *dout_bth = dout + ((size_t)b * T + t) * C + (size_t)h * hs; /* (hs) */

                /* through out = att . values */
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t voff = ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                    const float *value_t2 = qkv + voff;
                    float *dvalue_t2 = dqkv + voff;
                    double da = 0.0;
                    for (int i = 0; i < hs; i++) {
                        da += (double)value_t2[i] * dout_bth[i];
                        dvalue_t2[i] += (double)att_bth[t2] * dout_bth[i];
                    }
                    datt_bth[t2] = (float)da;
                }

                /* through the softmax: dpreatt = att (datt - sum(att datt)), the
                 * O(T) form of llm.c's Jacobian loop */
                double dot = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    dot += (double)att_bth[t2] * datt_bth[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    dpreatt_bth[t2] = (float)(att_bth[t2] * (datt_bth[t2] - dot));
                }

                /* through preatt = scale (query . key) */
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t koff = ((size_t)b * T + t2) * C3 + (size_t)C + (size_t)h * hs;
                    float *dkey_t2 = dqkv + koff;
                    double d = dpreatt_bth[t2] * scale;
                    for (int i = 0; i < hs; i++) {
                        dkey_t2[i] += d * query_t[i];
                    }
                }
                for (int i = 0; i < hs; i++) {
                    double dq = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *key_t2 = qkv + ((size_t)b * T + t2) * C3 + C;
                        dq += (double)dpreatt_bth[t2] * key_t2[(size_t)h * hs + i];
                    }
                    dquery_t[i] += dq * scale;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- gelu */

static const double gelu_k = 0.79788456080286535588; /* sqrt(2 / pi) */

void nn_gelu_forward(float *out, const float *inp, int N)
{
    for (int i = 0; i < N; i++) {
        double x = inp[i];
        double u = gelu_k * (x + 0.044715 * x * x * x);
        out[i] = (float)(0.5 * x * (1.0 + tanh(u)));
    }
}

void nn_gelu_backward(float *dinp, const float *inp, const float *dout, int N)
{
    for (int i = 0; i < N; i++) {
        double x = inp[i];
        double u = gelu_k * (x + 0.044715 * x * x * x);
        double th = tanh(u);
        /* d/dx: 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx, sech^2 = 1 - tanh^2 */
        double local_grad =
            0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * gelu_k * (1.0 + 3.0 * 0.044715 * x * x);
        dinp[i] += local_grad * dout[i];
    }
}

/* ---------------------------------------------------------------- residual */

void nn_residual_forward(float *out, const float *a, const float *b, int N)
{
    for (int i = 0; i < N; i++) {
        out[i] = a[i] + b[i];
    }
}

/* ---------------------------------------------------------------- cross-entropy */

void nn_crossentropy_forward(float *losses, float *probs, const float *logits,
                             const int32_t *targets, int B, int T, int V)
{
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *logits_bt = logits + bt * V; /* (V) */
        float *probs_bt = probs + bt * V;         /* (V) */
        float maxval = -INFINITY;
        for (int i = 0; i < V; i++) {
            maxval = fmaxf(maxval, logits_bt[i]);
        }
        double sum = 0.0;
        for (int i = 0; i < V; i++) {
            probs_bt[i] = expf(logits_bt[i] - maxval);
            sum += probs_bt[i];
        }
        double inv = 1.0 / sum;
        for (int i = 0; i < V; i++) {
            probs_bt[i] = (float)(probs_bt[i] * inv);
        }
        int ix = targets[bt];
        /* -log(p) = log(sum) - (logit - max): no log of an underflowed probability */
        losses[bt] = ix < 0 ? 0.0f : (float)(log(sum) - ((double)logits_bt[ix] - maxval));
    }
}

void nn_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                              float dloss, int B, int T, int V)
{
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        int ix = targets[bt];
        if (ix < 0) {
            continue;
        }
        float *dlogits_bt = dlogits + bt * V;   /* (V) */
        const float *probs_bt = probs + bt * V; /* (V) */
        for (int i = 0; i < V; i++) {
            double indicator = i == ix ? 1.0 : 0.0;
            dlogits_bt[i] += (probs_bt[i] - indicator) * dloss;
        }
    }
}
