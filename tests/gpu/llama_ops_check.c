/* tests/gpu/llama_ops_check.c — the Llama layers on CUDA (nn/llama_ops_cuda.h:
 * RMSNorm, RoPE, SwiGLU), the grouped-query flash attention of nn/ops_cuda.h
 * (nn_cuda_flash_*) and its attention over a KV cache
 * (nn_cuda_attention_cached) against their CPU twins (nn/llama_ops_cpu.h,
 * themselves checked against PyTorch in float64).
 *
 * Runs on a machine with a GPU (tests/gpu/test_llama_ops.sh). As
 * gpt2_ops_check.c: inputs are fresh random values (never zeros) rounded to
 * bf16 on the host, so both sides see the same numbers, and the CPU computes
 * from them; device outputs are poisoned (all bits set: NaN) before each call,
 * so an unwritten element fails; f32 parameter gradients start from random
 * values on both sides, which checks that they are added into (+=). The
 * measure is ||cuda - cpu|| / ||cpu|| over a tensor, printed with its bound:
 *   1.5e-2  bf16 outputs of one layer (bf16 rounding of the result, 2^-9 per
 *           element, plus the kernel's f32 order of summation);
 *   3e-2    attention's bf16 outputs, out and dq, dk, dv (bf16 operands of
 *           the products inside, and probabilities rounded to bf16 before
 *           they multiply v or dout, as in gpt2_ops_check.c);
 *   1e-3    f32 parameter gradients (same bf16 inputs, only f32 sums
 *           differ);
 *   1e-5    RMSNorm's f32 rstd and attention's f32 log-sum-exp per row (f32
 *           sums of the same bf16 inputs against double ones).
 * Measured on an H200: one layer's bf16 outputs within 1.9e-3, attention's
 * within 2.7e-3, dweight 1.5e-7, rstd 8.5e-8, lse 1.0e-7.
 * The attention over a KV cache (nn_cuda_attention_cached, a decoder's) is
 * held to 1.5e-2 against nn_attention_cached: its products and softmax are
 * f32 from the same bf16 inputs, so only the bf16 rounding of the output and
 * the f32 sums differ (not measured yet).
 * The CPU's RoPE rotates positions 0..T-1: at pos0 > 0 its reference runs
 * each sequence with pos0 leading zero tokens and keeps the last T. The
 * GPU's angles are f32, as HF's (the CPU's double): at pos0 131000 they are
 * off by up to 4e-3 rad in the two fastest dims, far inside the bound. Each
 * op runs twice from the same inputs and must give the same bits (no atomics).
 * Shapes are Llama's or odd on purpose: N = 2 x 257 rows, T not a multiple of
 * the attention's 64-row tiles, heads 32/8 (4:1), 16/2 (8:1), 9/3, 24/8 and
 * 4/4 (multi-head), head sizes 64 and 128, C 576 to 16384 (every RMSNorm
 * kernel shape), and widths that are not a multiple of 8 for the one-element
 * kernels. Prints TAP.
 *   --bench  then times each op at Llama 3.2 1B's shape (B 2, T 4096, C 2048,
 *            NH 32, NKV 8, hd 64, F 8192) and at a head-128 shape (NH 24,
 *            NKV 8, hd 128, C 3072), median of 20 ("#" lines: ms, GB/s of
 *            the bytes each op must move, attention's TFLOP/s)
 *   --bench-only  the timings without the checks (plan 1..0: not a test)
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef BMT_HAVE_CUDA
int main(void)
{
    printf("1..0 # SKIP built without CUDA\n");
    return 0;
}
#else
#include <cuda_runtime.h>

#include "bmt/bmt.h"
#include "nn/llama_ops_cpu.h"
#include "nn/llama_ops_cuda.h"
#include "nn/ops_cuda.h"

#include "gpu_check.h"

/* ------------------------------------------------------------ RMSNorm */

static void t_rmsnorm(int N, int C)
{
    bmt_error_t err;
    char name[128];
    const size_t n = (size_t)N * C;
    const float eps = 1e-5f;
    float *x = rnd(n, 1.0f), *w = rnd(C, 1.0f);
    for (size_t i = 0; i < n; i++) /* rows of different scales: rstd matters */
        x[i] = bf16r(x[i] * (0.25f + (float)(i / C % 7)));
    float *ref = zeros(n), *rr = zeros(N);
    nn_rmsnorm_forward(ref, rr, x, w, N, C, eps);
    void *dx = up_bf16(x, n), *dw = up_bf16(w, C), *dout = dmalloc(n * 2);
    float *drs = dmalloc((size_t)N * 4);
    run(nn_cuda_rmsnorm_forward(h, dout, drs, dx, dw, N, C, eps, &err), "rmsnorm forward", &err);
    float *got = down_bf16(dout, n), *grs = down_f32(drs, N);
    snprintf(name, sizeof(name), "rmsnorm forward (N %d, C %d)", N, C);
    check(name, got, ref, n, 1.5e-2);
    snprintf(name, sizeof(name), "rmsnorm forward rstd (N %d, C %d)", N, C);
    check(name, grs, rr, N, 1e-5);
    poison(dout, n * 2), poison(drs, (size_t)N * 4);
    run(nn_cuda_rmsnorm_forward(h, dout, drs, dx, dw, N, C, eps, &err), "rmsnorm forward", &err);
    float *got2 = down_bf16(dout, n), *grs2 = down_f32(drs, N);
    check_same("rmsnorm forward out", got, got2, n);
    check_same("rmsnorm forward rstd", grs, grs2, N);

    /* backward: dinp = dres + ..., dweight += ; the CPU's rstd on both sides */
    float *dy = rnd(n, 1.0f), *dres = rnd(n, 1.0f), *gw = rnd(C, 1.0f);
    float *rdx = copy(dres, n), *rdx0 = zeros(n), *rgw = copy(gw, C), *rgw0 = copy(gw, C);
    nn_rmsnorm_backward(rdx, rgw, dy, x, w, rr, N, C);
    nn_rmsnorm_backward(rdx0, rgw0, dy, x, w, rr, N, C); /* dres NULL */
    void *ddy = up_bf16(dy, n), *ddres = up_bf16(dres, n), *ddx = dmalloc(n * 2);
    float *dgw = up_f32(gw, C), *dcr = up_f32(rr, N);
    run(nn_cuda_rmsnorm_backward(h, ddx, ddres, dgw, ddy, dx, dw, dcr, N, C, 1, &err),
        "rmsnorm backward", &err);
    float *gdx = down_bf16(ddx, n), *ggw = down_f32(dgw, C);
    snprintf(name, sizeof(name), "rmsnorm backward dinp = dres + ... (N %d, C %d)", N, C);
    check(name, gdx, rdx, n, 1.5e-2);
    snprintf(name, sizeof(name), "rmsnorm backward dweight (+=) (N %d, C %d)", N, C);
    check(name, ggw, rgw, C, 1e-3);
    /* again from the same start: the same bits */
    h2d(dgw, gw, (size_t)C * 4);
    poison(ddx, n * 2);
    run(nn_cuda_rmsnorm_backward(h, ddx, ddres, dgw, ddy, dx, dw, dcr, N, C, 1, &err),
        "rmsnorm backward", &err);
    float *gdx2 = down_bf16(ddx, n), *ggw2 = down_f32(dgw, C);
    check_same("rmsnorm backward dinp", gdx, gdx2, n);
    check_same("rmsnorm backward dweight", ggw, ggw2, C);
    /* in place (dres == dinp), as the layers use it */
    h2d(dgw, gw, (size_t)C * 4);
    run(nn_cuda_rmsnorm_backward(h, ddres, ddres, dgw, ddy, dx, dw, dcr, N, C, 1, &err),
        "rmsnorm backward", &err);
    float *gip = down_bf16(ddres, n);
    check("rmsnorm backward in place (dinp == dres)", gip, rdx, n, 1.5e-2);
    /* dres NULL: dinp is the input gradient alone */
    h2d(dgw, gw, (size_t)C * 4);
    poison(ddx, n * 2);
    run(nn_cuda_rmsnorm_backward(h, ddx, NULL, dgw, ddy, dx, dw, dcr, N, C, 1, &err),
        "rmsnorm backward", &err);
    float *g0 = down_bf16(ddx, n), *ggw0 = down_f32(dgw, C);
    check("rmsnorm backward, dres NULL: dinp", g0, rdx0, n, 1.5e-2);
    check("rmsnorm backward, dres NULL: dweight (+=)", ggw0, rgw0, C, 1e-3);
    /* add 0 (a fresh gradient): dweight written into a NaN-filled buffer */
    float *rgwz = zeros(C), *rdxz = zeros(n);
    nn_rmsnorm_backward(rdxz, rgwz, dy, x, w, rr, N, C);
    float *dgwz = dmalloc((size_t)C * 4);
    run(nn_cuda_rmsnorm_backward(h, ddx, ddres, dgwz, ddy, dx, dw, dcr, N, C, 0, &err),
        "rmsnorm backward", &err);
    float *ggwz = down_f32(dgwz, C);
    check("rmsnorm backward dweight (=, into NaN)", ggwz, rgwz, C, 1e-3);
    free(rgwz), free(rdxz), free(ggwz);
    cudaFree(dgwz);
    free(x), free(w), free(ref), free(rr), free(got), free(grs), free(got2), free(grs2), free(dy);
    free(dres), free(gw), free(rdx), free(rdx0), free(rgw), free(rgw0), free(gdx), free(ggw);
    free(gdx2), free(ggw2), free(gip), free(g0), free(ggw0);
    cudaFree(dx), cudaFree(dw), cudaFree(dout), cudaFree(drs), cudaFree(ddy), cudaFree(ddres);
    cudaFree(ddx), cudaFree(dgw), cudaFree(dcr);
}

/* ------------------------------------------------------------ RoPE */

/* The CPU's rotation of qkv's query and key heads at positions pos0 + t:
 * each sequence's heads of one kind, behind pos0 zero tokens, through
 * nn_rope_forward (bwd 0: out = rot(x)) or nn_rope_backward (bwd 1: out =
 * rot^T(x)); the value heads are copied. qkv, out (B,T,(NH + 2 NKV) hd). */
static void rope_ref(float *out, const float *qkv, const float *inv_freq, int B, int T, int NH,
                     int NKV, int hd, int pos0, int bwd)
{
    const int row = (NH + 2 * NKV) * hd, Tx = pos0 + T;
    memcpy(out, qkv, (size_t)B * T * row * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int part = 0; part < 2; part++) { /* the query heads, then the key heads */
            const int nh = part ? NKV : NH, off = part ? NH * hd : 0, w = nh * hd;
            float *in = zeros((size_t)Tx * w), *rot = zeros((size_t)Tx * w);
            for (int t = 0; t < T; t++)
                memcpy(in + (size_t)(pos0 + t) * w, qkv + ((size_t)b * T + t) * row + off,
                       (size_t)w * sizeof(float));
            if (bwd)
                nn_rope_backward(rot, in, inv_freq, 1, Tx, nh, hd); /* rot = 0 + rot^T(in) */
            else
                nn_rope_forward(rot, in, inv_freq, 1, Tx, nh, hd);
            for (int t = 0; t < T; t++)
                memcpy(out + ((size_t)b * T + t) * row + off, rot + (size_t)(pos0 + t) * w,
                       (size_t)w * sizeof(float));
            free(in), free(rot);
        }
    }
}

/* The query and key heads of qkv (B,T,(NH + 2 NKV) hd) as one dense array,
 * and the value heads as another. */
static void split_qk_v(float *qk, float *v, const float *qkv, size_t N, int NH, int NKV, int hd)
{
    const size_t row = (size_t)(NH + 2 * NKV) * hd, wqk = (size_t)(NH + NKV) * hd,
                 wv = (size_t)NKV * hd;
    for (size_t n = 0; n < N; n++) {
        memcpy(qk + n * wqk, qkv + n * row, wqk * sizeof(float));
        memcpy(v + n * wv, qkv + n * row + wqk, wv * sizeof(float));
    }
}

static void t_rope(int B, int T, int NH, int NKV, int hd, int pos0, bool scaled)
{
    bmt_error_t err;
    char name[160], shape[112];
    const size_t N = (size_t)B * T, row = (size_t)(NH + 2 * NKV) * hd, n = N * row;
    const size_t nqk = N * (NH + NKV) * hd, nv = N * NKV * hd;
    const nn_rope_scaling_t s32 = { 32.0, 1.0, 4.0, 8192 }; /* Llama 3.2's */
    float *inv = zeros(hd / 2);
    nn_rope_freqs(inv, hd, 500000.0, scaled ? &s32 : NULL);
    snprintf(shape, sizeof(shape), "B %d, T %d, NH %d, NKV %d, hd %d, pos0 %d%s", B, T, NH, NKV, hd,
             pos0, scaled ? ", Llama 3 scaling" : "");
    float *qkv = rnd(n, 1.0f), *ref = zeros(n);
    rope_ref(ref, qkv, inv, B, T, NH, NKV, hd, pos0, 0);
    float *dinv = up_f32(inv, hd / 2);
    void *dq = up_bf16(qkv, n);
    run(nn_cuda_rope_forward(h, dq, dinv, B, T, NH, NKV, hd, pos0, &err), "rope forward", &err);
    float *got = down_bf16(dq, n);
    float *gqk = zeros(nqk), *gv = zeros(nv), *rqk = zeros(nqk), *rv = zeros(nv);
    split_qk_v(gqk, gv, got, N, NH, NKV, hd);
    split_qk_v(rqk, rv, ref, N, NH, NKV, hd);
    snprintf(name, sizeof(name), "rope forward, q and k heads (%s)", shape);
    check(name, gqk, rqk, nqk, 1.5e-2);
    check_true(memcmp(gv, rv, nv * sizeof(float)) == 0, "rope forward: v heads untouched");
    put_bf16(dq, qkv, n);
    run(nn_cuda_rope_forward(h, dq, dinv, B, T, NH, NKV, hd, pos0, &err), "rope forward", &err);
    float *got2 = down_bf16(dq, n);
    check_same("rope forward", got, got2, n);

    /* backward: the transpose rotation, in place on dqkv */
    float *dy = rnd(n, 1.0f), *rdy = zeros(n);
    rope_ref(rdy, dy, inv, B, T, NH, NKV, hd, pos0, 1);
    put_bf16(dq, dy, n);
    run(nn_cuda_rope_backward(h, dq, dinv, B, T, NH, NKV, hd, pos0, &err), "rope backward", &err);
    float *gdy = down_bf16(dq, n);
    split_qk_v(gqk, gv, gdy, N, NH, NKV, hd);
    split_qk_v(rqk, rv, rdy, N, NH, NKV, hd);
    snprintf(name, sizeof(name), "rope backward, q and k heads (%s)", shape);
    check(name, gqk, rqk, nqk, 1.5e-2);
    check_true(memcmp(gv, rv, nv * sizeof(float)) == 0, "rope backward: v heads untouched");
    free(inv), free(qkv), free(ref), free(got), free(gqk), free(gv), free(rqk), free(rv);
    free(got2), free(dy), free(rdy), free(gdy);
    cudaFree(dinv), cudaFree(dq);
}

/* ------------------------------------------------------------ SwiGLU */

static void t_swiglu(int N, int F)
{
    bmt_error_t err;
    char name[96];
    const size_t n = (size_t)N * F;
    float *gu = rnd(2 * n, 2.0f);
    gu[0] = -100.0f, gu[1] = 100.0f, gu[2] = -30.0f; /* the sigmoid's tails: no NaN */
    float *gate = zeros(n), *up = zeros(n), *ref = zeros(n);
    for (int r = 0; r < N; r++) {
        memcpy(gate + (size_t)r * F, gu + (size_t)r * 2 * F, (size_t)F * sizeof(float));
        memcpy(up + (size_t)r * F, gu + (size_t)r * 2 * F + F, (size_t)F * sizeof(float));
    }
    nn_swiglu_forward(ref, gate, up, (int)n);
    void *dgu = up_bf16(gu, 2 * n), *dout = dmalloc(n * 2);
    run(nn_cuda_swiglu_forward(h, dout, dgu, N, F, &err), "swiglu forward", &err);
    float *got = down_bf16(dout, n);
    snprintf(name, sizeof(name), "swiglu forward (N %d, F %d)", N, F);
    check(name, got, ref, n, 1.5e-2);
    poison(dout, n * 2);
    run(nn_cuda_swiglu_forward(h, dout, dgu, N, F, &err), "swiglu forward", &err);
    float *got2 = down_bf16(dout, n);
    check_same("swiglu forward", got, got2, n);

    float *dy = rnd(n, 1.0f), *rdg = zeros(n), *rdu = zeros(n);
    nn_swiglu_backward(rdg, rdu, dy, gate, up, (int)n);
    void *ddy = up_bf16(dy, n), *ddgu = dmalloc(4 * n);
    run(nn_cuda_swiglu_backward(h, ddgu, ddy, dgu, N, F, &err), "swiglu backward", &err);
    float *g = down_bf16(ddgu, 2 * n), *gdg = zeros(n), *gdu = zeros(n);
    for (int r = 0; r < N; r++) {
        memcpy(gdg + (size_t)r * F, g + (size_t)r * 2 * F, (size_t)F * sizeof(float));
        memcpy(gdu + (size_t)r * F, g + (size_t)r * 2 * F + F, (size_t)F * sizeof(float));
    }
    snprintf(name, sizeof(name), "swiglu backward dgate (N %d, F %d)", N, F);
    check(name, gdg, rdg, n, 1.5e-2);
    snprintf(name, sizeof(name), "swiglu backward dup (N %d, F %d)", N, F);
    check(name, gdu, rdu, n, 1.5e-2);
    poison(ddgu, 4 * n);
    run(nn_cuda_swiglu_backward(h, ddgu, ddy, dgu, N, F, &err), "swiglu backward", &err);
    float *g2 = down_bf16(ddgu, 2 * n);
    check_same("swiglu backward", g, g2, 2 * n);
    free(gu), free(gate), free(up), free(ref), free(got), free(got2), free(dy), free(rdg);
    free(rdu), free(g), free(gdg), free(gdu), free(g2);
    cudaFree(dgu), cudaFree(dout), cudaFree(ddy), cudaFree(ddgu);
}

/* ------------------------------------------------------------ flash attention */

/* qkv (N, (NH + 2 NKV) hd) <-> q (N, NH hd), k and v (N, NKV hd). */
static void split_qkv(float *q, float *k, float *v, const float *qkv, size_t N, int NH, int NKV,
                      int hd)
{
    const size_t wq = (size_t)NH * hd, wk = (size_t)NKV * hd, row = wq + 2 * wk;
    for (size_t n = 0; n < N; n++) {
        memcpy(q + n * wq, qkv + n * row, wq * sizeof(float));
        memcpy(k + n * wk, qkv + n * row + wq, wk * sizeof(float));
        memcpy(v + n * wk, qkv + n * row + wq + wk, wk * sizeof(float));
    }
}

static int attn_mode_now; /* what nn_cuda_attention_mode was given last */

static void t_flash(int B, int T, int NH, int NKV, int hd)
{
    bmt_error_t err;
    char name[192], shape[128];
    const size_t N = (size_t)B * T, nq = N * NH * hd, nk = N * NKV * hd, n = nq + 2 * nk;
    const size_t nl = (size_t)B * NH * T;
    const char *kind =
        (hd == 64 || hd == 128) && attn_mode_now == 0 ? nn_cuda_attention_kernel(h) : "mma.sync";
    snprintf(shape, sizeof(shape), "B %d, T %d, NH %d, NKV %d, hd %d, %s", B, T, NH, NKV, hd, kind);
    if (!nn_cuda_flash_ok(hd)) {
        snprintf(name, sizeof(name), "nn_cuda_flash_ok(%d) (%s)", hd, shape);
        check_true(false, name);
        return;
    }
    float *qkv = rnd(n, 1.0f), *q = zeros(nq), *k = zeros(nk), *v = zeros(nk);
    split_qkv(q, k, v, qkv, N, NH, NKV, hd);
    float *ref = zeros(nq), *rl = zeros(nl);
    nn_attention_forward(ref, rl, q, k, v, B, T, NH, NKV, hd);
    void *dqkv = up_bf16(qkv, n), *dout = dmalloc(nq * 2);
    float *dl = dmalloc(nl * 4);
    run(nn_cuda_flash_forward(h, dout, dl, dqkv, B, T, NH, NKV, hd, &err), "flash forward", &err);
    float *got = down_bf16(dout, nq), *gl = down_f32(dl, nl);
    snprintf(name, sizeof(name), "flash attention forward out (%s)", shape);
    check(name, got, ref, nq, 3e-2);
    snprintf(name, sizeof(name), "flash attention forward lse (%s)", shape);
    check(name, gl, rl, nl, 1e-5);
    poison(dout, nq * 2), poison(dl, nl * 4);
    run(nn_cuda_flash_forward(h, dout, dl, dqkv, B, T, NH, NKV, hd, &err), "flash forward", &err);
    float *got2 = down_bf16(dout, nq), *gl2 = down_f32(dl, nl);
    check_same("flash attention forward out", got, got2, nq);
    check_same("flash attention forward lse", gl, gl2, nl);

    /* backward from the GPU's saved out and lse; the CPU's from its own */
    float *dy = rnd(nq, 1.0f), *rdq = zeros(nq), *rdk = zeros(nk), *rdv = zeros(nk);
    nn_attention_backward(rdq, rdk, rdv, dy, ref, rl, q, k, v, B, T, NH, NKV, hd);
    void *ddy = up_bf16(dy, nq), *ddqkv = dmalloc(n * 2);
    float *Dd = dmalloc(nl * 4);
    run(nn_cuda_flash_backward(h, ddqkv, Dd, ddy, dout, dqkv, dl, B, T, NH, NKV, hd, &err),
        "flash backward", &err);
    float *g = down_bf16(ddqkv, n), *gdq = zeros(nq), *gdk = zeros(nk), *gdv = zeros(nk);
    split_qkv(gdq, gdk, gdv, g, N, NH, NKV, hd);
    snprintf(name, sizeof(name), "flash attention backward dq (%s)", shape);
    check(name, gdq, rdq, nq, 3e-2);
    snprintf(name, sizeof(name), "flash attention backward dk (%s)", shape);
    check(name, gdk, rdk, nk, 3e-2);
    snprintf(name, sizeof(name), "flash attention backward dv (%s)", shape);
    check(name, gdv, rdv, nk, 3e-2);
    poison(ddqkv, n * 2), poison(Dd, nl * 4);
    run(nn_cuda_flash_backward(h, ddqkv, Dd, ddy, dout, dqkv, dl, B, T, NH, NKV, hd, &err),
        "flash backward", &err);
    float *g2 = down_bf16(ddqkv, n);
    check_same("flash attention backward dqkv", g, g2, n);
    free(qkv), free(q), free(k), free(v), free(ref), free(rl), free(got), free(gl), free(got2);
    free(gl2), free(dy), free(rdq), free(rdk), free(rdv), free(g), free(gdq), free(gdk);
    free(gdv), free(g2);
    cudaFree(dqkv), cudaFree(dout), cudaFree(dl), cudaFree(ddy), cudaFree(ddqkv), cudaFree(Dd);
}

/* Shapes the flash kernels cannot take are refused before any launch: T past
 * 65535 tiles of 64 rows (the grids' y), more than 2^31 - 1 (batch, head)
 * pairs (the grids' x), NH not a multiple of NKV, a head size they lack. */
static void t_flash_refused(void)
{
    bmt_error_t err;
    const struct {
        int B, T, NH, NKV, hd;
        const char *what;
    } bad[] = {
        { 1, 65535 * 64 + 1, 4, 4, 64, "T 4194241" },
        { 1, 0x7fffffff, 4, 4, 64, "T 2^31 - 1" },
        { 65536, 64, 32768, 8, 64, "B 65536 x NH 32768 pairs" },
        { 1, 64, 6, 4, 64, "NH 6 on NKV 4" },
        { 1, 64, 4, 4, 96, "head size 96" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[240];
        err.text[0] = '\0';
        const int rc = nn_cuda_flash_forward(h, NULL, NULL, NULL, bad[i].B, bad[i].T, bad[i].NH,
                                             bad[i].NKV, bad[i].hd, &err);
        snprintf(name, sizeof(name), "flash attention forward refuses %s (%s)", bad[i].what,
                 err.text);
        check_true(rc == -1 && err.text[0] != '\0', name);
    }
}

/* ------------------------------------------------------------ attention over a KV cache */

/* nn_cuda_attention_cached against nn_attention_cached: n queries at
 * positions pos0.. read from packed qkv rows (ldq = (NH + 2 NKV) hd, the q
 * part where it lies), over a cache of pos0 + n + 5 positions (the rows past
 * pos0 + n must not be read: they are NaN on both sides). qscale > 1 sharpens
 * the softmax (scores of several units: the running maximum is rescaled). */
static void t_attn_cached(int pos0, int n, int NH, int NKV, int hd, float qscale)
{
    bmt_error_t err;
    char name[192], shape[128];
    const int ldq = (NH + 2 * NKV) * hd, cap = pos0 + n + 5;
    const size_t nq = (size_t)n * ldq, no = (size_t)n * NH * hd, nc = (size_t)cap * NKV * hd;
    snprintf(shape, sizeof(shape), "pos0 %d, n %d, NH %d, NKV %d, hd %d, q x %g", pos0, n, NH, NKV,
             hd, qscale);
    float *q = rnd(nq, qscale), *kc = rnd(nc, 1.0f), *vc = rnd(nc, 1.0f), *ref = zeros(no);
    for (size_t i = (size_t)(pos0 + n) * NKV * hd; i < nc; i++)
        kc[i] = vc[i] = NAN; /* past the last query's position */
    double *scratch = xmalloc(((size_t)cap + hd) * sizeof(double));
    nn_attention_cached(ref, q, ldq, kc, vc, pos0, n, NH, NKV, hd, scratch);
    void *dq = up_bf16(q, nq), *dk = up_bf16(kc, nc), *dv = up_bf16(vc, nc),
         *dout = dmalloc(no * 2);
    run(nn_cuda_attention_cached(h, dout, dq, ldq, dk, dv, pos0, n, NH, NKV, hd, &err),
        "attention over the cache", &err);
    float *got = down_bf16(dout, no);
    snprintf(name, sizeof(name), "attention over a KV cache (%s)", shape);
    check(name, got, ref, no, 1.5e-2);
    poison(dout, no * 2);
    run(nn_cuda_attention_cached(h, dout, dq, ldq, dk, dv, pos0, n, NH, NKV, hd, &err),
        "attention over the cache", &err);
    float *got2 = down_bf16(dout, no);
    check_same("attention over a KV cache", got, got2, no);
    free(q), free(kc), free(vc), free(ref), free(scratch), free(got), free(got2);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout);
}

/* What nn_cuda_attention_cached refuses: -1 and a text, nothing launched. */
static void t_attn_cached_refused(void)
{
    bmt_error_t err;
    const struct {
        int ldq, n, NH, NKV, hd;
        const char *what;
    } bad[] = {
        { 8 * 257, 1, 8, 8, 257, "head size 257" }, { 0, 1, 8, 8, 0, "head size 0" },
        { 6 * 64, 1, 6, 4, 64, "NH 6 on NKV 4" },   { 7 * 64, 1, 8, 8, 64, "ldq < NH hd" },
        { 8 * 64, -1, 8, 8, 64, "n -1" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[160];
        err.text[0] = '\0';
        const int rc = nn_cuda_attention_cached(h, NULL, NULL, bad[i].ldq, NULL, NULL, 0, bad[i].n,
                                                bad[i].NH, bad[i].NKV, bad[i].hd, &err);
        snprintf(name, sizeof(name), "attention over a KV cache refuses %s (%s)", bad[i].what,
                 err.text);
        check_true(rc == -1 && err.text[0] != '\0', name);
    }
}

/* ------------------------------------------------------------ timing (--bench)
 *
 * Diagnostics, not tests: each op at one shape, the median of 20 runs timed
 * with events, with the rate of the bytes it must move (each input read and
 * each output written once) and, for attention, of its causal FLOPs: 2 x 2 B
 * NH T^2 hd / 2 forward (q k^T and p v over the lower triangle), 2.5 times
 * that backward. Prints "#" lines.
 */
static float time_ms(void (*fn)(void *), void *arg)
{
    enum {
        RUNS = 20
    };
    cudaEvent_t a, b;
    float t[RUNS];
    ck(cudaEventCreate(&a), "event");
    ck(cudaEventCreate(&b), "event");
    fn(arg); /* warm-up */
    for (int i = 0; i < RUNS; i++) {
        ck(cudaEventRecord(a, stream), "event");
        fn(arg);
        ck(cudaEventRecord(b, stream), "event");
        ck(cudaEventSynchronize(b), "event");
        ck(cudaEventElapsedTime(&t[i], a, b), "event");
    }
    for (int i = 0; i < RUNS; i++) /* sort for the median */
        for (int j = i + 1; j < RUNS; j++)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j], t[j] = x;
            }
    cudaEventDestroy(a), cudaEventDestroy(b);
    return (t[(RUNS - 1) / 2] + t[RUNS / 2]) / 2;
}

typedef struct bench_bufs {
    int B, T, C, NH, NKV, hd, F, N, op;
    void *x, *y, *dres, *w, *qkv, *dqkv, *att, *datt, *gu, *dgu, *mlp;
    float *rstd, *gw, *inv, *lse, *Dd;
} bench_bufs_t;

static void bench_op(void *arg)
{
    bench_bufs_t *z = arg;
    bmt_error_t err;
    int rc = 0;
    switch (z->op) {
    case 0:
        rc = nn_cuda_rmsnorm_forward(h, z->y, z->rstd, z->x, z->w, z->N, z->C, 1e-5f, &err);
        break;
    case 1: /* into the residual stream's gradient in place, as the model runs it */
        rc = nn_cuda_rmsnorm_backward(h, z->dres, z->dres, z->gw, z->y, z->x, z->w, z->rstd, z->N,
                                      z->C, 1, &err);
        break;
    case 2:
        rc = nn_cuda_rope_forward(h, z->qkv, z->inv, z->B, z->T, z->NH, z->NKV, z->hd, 0, &err);
        break;
    case 3:
        rc = nn_cuda_rope_backward(h, z->dqkv, z->inv, z->B, z->T, z->NH, z->NKV, z->hd, 0, &err);
        break;
    case 4: rc = nn_cuda_swiglu_forward(h, z->mlp, z->gu, z->N, z->F, &err); break;
    case 5: rc = nn_cuda_swiglu_backward(h, z->dgu, z->mlp, z->gu, z->N, z->F, &err); break;
    case 6:
        rc = nn_cuda_flash_forward(h, z->att, z->lse, z->qkv, z->B, z->T, z->NH, z->NKV, z->hd,
                                   &err);
        break;
    case 7:
        rc = nn_cuda_flash_backward(h, z->dqkv, z->Dd, z->datt, z->att, z->qkv, z->lse, z->B, z->T,
                                    z->NH, z->NKV, z->hd, &err);
        break;
    }
    if (rc < 0)
        die("bench", err.text);
}

static void bench(int NH, int NKV, int hd, int C)
{
    bench_bufs_t z = { .B = 2, .T = 4096, .C = C, .NH = NH, .NKV = NKV, .hd = hd, .F = 8192 };
    const size_t N = (size_t)z.B * z.T, row = (size_t)(NH + 2 * NKV) * hd;
    const size_t nq = N * NH * hd, nl = (size_t)z.B * NH * z.T;
    z.N = (int)N;
    /* the random values every buffer is made from: the largest is gu (N, 2F) */
    float *r = rnd(N * 2 * z.F, 1.0f), *inv = zeros(hd / 2);
    for (size_t i = 0; i < N; i++) /* sane RMSNorm statistics */
        r[i] = 1.0f;
    nn_rope_freqs(inv, hd, 500000.0, NULL);
    z.x = up_bf16(r, N * C), z.y = up_bf16(r, N * C), z.dres = up_bf16(r, N * C);
    z.w = up_bf16(r, C);
    z.qkv = up_bf16(r, N * row), z.dqkv = up_bf16(r, N * row);
    z.att = up_bf16(r, nq), z.datt = up_bf16(r, nq);
    z.gu = up_bf16(r, N * 2 * z.F), z.dgu = dmalloc(N * 2 * z.F * 2), z.mlp = up_bf16(r, N * z.F);
    z.rstd = up_f32(r, N), z.gw = up_f32(r, C), z.inv = up_f32(inv, hd / 2);
    z.lse = dmalloc(nl * 4), z.Dd = dmalloc(nl * 4);
    /* the bytes each op must move: every input read and every output written once */
    const double nc = 2.0 * N * C, nr = 2.0 * N * (NH + NKV) * hd, nf = 2.0 * N * z.F;
    const struct {
        const char *name;
        int op;
        double bytes;
    } ops[] = {
        { "rmsnorm fwd", 0, 2 * nc },         { "rmsnorm bwd (dinp == dres)", 1, 4 * nc },
        { "rope fwd (in place)", 2, 2 * nr }, { "rope bwd (in place)", 3, 2 * nr },
        { "swiglu fwd", 4, 3 * nf },          { "swiglu bwd", 5, 5 * nf },
        { "flash attention fwd", 6, 0 },      { "flash attention bwd", 7, 0 },
    };
    const double flop_fwd = 2.0 * 2.0 * z.B * NH * (double)z.T * z.T * hd / 2;
    printf("# timing at B %d, T %d, C %d, NH %d, NKV %d, hd %d, F %d, median of 20%s\n", z.B, z.T,
           C, NH, NKV, hd, z.F,
           strcmp(nn_cuda_attention_kernel(h), "wgmma") == 0 ? " (flash: wgmma kernels)"
                                                             : " (flash: mma.sync kernels)");
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (ops[i].op >= 6 && !nn_cuda_flash_ok(hd)) {
            printf("#   %-24s not run: nn_cuda_flash_ok(%d) is 0\n", ops[i].name, hd);
            continue;
        }
        z.op = ops[i].op;
        const float ms = time_ms(bench_op, &z);
        if (ops[i].op >= 6) {
            const double f = ops[i].op == 6 ? flop_fwd : 2.5 * flop_fwd;
            printf("#   %-24s %8.3f ms %6.0f TFLOP/s\n", ops[i].name, ms, f / (ms * 1e-3) / 1e12);
        } else {
            printf("#   %-24s %8.3f ms %6.0f GB/s\n", ops[i].name, ms,
                   ops[i].bytes / (ms * 1e-3) / 1e9);
        }
    }
    if (nn_cuda_flash_ok(hd) && strcmp(nn_cuda_attention_kernel(h), "wgmma") == 0) {
        nn_cuda_attention_mode(h, 2);
        z.op = 6;
        const float mf = time_ms(bench_op, &z);
        z.op = 7;
        const float mb = time_ms(bench_op, &z);
        printf("#   flash attention, mma.sync kernels: fwd %.3f ms %.0f TFLOP/s, bwd %.3f ms %.0f "
               "TFLOP/s\n",
               mf, flop_fwd / (mf * 1e-3) / 1e12, mb, 2.5 * flop_fwd / (mb * 1e-3) / 1e12);
        nn_cuda_attention_mode(h, 0);
    }
    free(r), free(inv);
    cudaFree(z.x), cudaFree(z.y), cudaFree(z.dres), cudaFree(z.w), cudaFree(z.qkv),
        cudaFree(z.dqkv);
    cudaFree(z.att), cudaFree(z.datt), cudaFree(z.gu), cudaFree(z.dgu), cudaFree(z.mlp);
    cudaFree(z.rstd), cudaFree(z.gw), cudaFree(z.inv), cudaFree(z.lse), cudaFree(z.Dd);
}

int main(int argc, char **argv)
{
    bmt_error_t err;
    void *ws;
    ck(cudaSetDevice(0), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    ck(cudaMalloc(&ws, nn_cuda_workspace_bytes(4 * 4096)), "cudaMalloc");
    if ((h = nn_cuda_create(stream, ws, 4 * 4096, &err)) == NULL)
        die("nn_cuda_create", err.text);

    const bool bench_only = argc > 1 && strcmp(argv[1], "--bench-only") == 0;
    if (bench_only)
        goto timing;
    /* RMSNorm: every kernel shape (16-byte units over 256 and 1024 threads,
     * one-element units where C % 8 != 0), several steps per block (N 5001) */
    t_rmsnorm(514, 2048);
    t_rmsnorm(514, 576);
    t_rmsnorm(514, 4096);
    t_rmsnorm(5001, 576);
    t_rmsnorm(5001, 3072);
    t_rmsnorm(64, 8192);
    t_rmsnorm(64, 16384);
    t_rmsnorm(77, 100);
    t_rmsnorm(300, 1500);
    t_rmsnorm(33, 3001);
    t_rmsnorm(33, 6001);

    /* RoPE on packed qkv: heads 4:1, 8:1, 3:1 and multi-head, hd 64 and 128
     * (16-byte kernel) and 40 (one element at a time), positions from 0, 1000
     * and 131000 (past sincosf's fast range reduction) */
    t_rope(2, 257, 32, 8, 64, 0, true);
    t_rope(2, 257, 32, 8, 64, 1000, true);
    t_rope(2, 257, 16, 2, 128, 1000, true);
    t_rope(2, 257, 9, 3, 64, 0, false);
    t_rope(2, 257, 4, 4, 128, 1000, true);
    t_rope(2, 17, 4, 1, 128, 131000, true);
    t_rope(2, 33, 6, 2, 40, 1000, true);

    /* SwiGLU: Llama 3.2 1B's F, SmolLM's, and an F % 8 != 0 */
    t_swiglu(514, 8192);
    t_swiglu(514, 1536);
    t_swiglu(77, 100);

    /* Grouped-query flash attention on packed qkv */
    t_flash(2, 257, 32, 8, 64);  /* Llama 3.2 1B's heads, 4:1 */
    t_flash(2, 257, 24, 8, 128); /* Llama 3.2 3B's, 3:1 */
    t_flash(2, 65, 16, 2, 128);  /* 8:1 */
    t_flash(2, 63, 9, 3, 64);    /* 3:1 */
    t_flash(2, 64, 4, 4, 64);    /* multi-head */
    t_flash(2, 64, 4, 4, 128);
    t_flash(2, 1, 8, 2, 64); /* one token */
    t_flash(2, 1, 8, 1, 128);
    t_flash(2, 1000, 6, 2, 64); /* many tiles, the last one partial */
    t_flash(2, 560, 4, 2, 64);  /* a last block with one warpgroup's rows */
    t_flash(2, 1000, 4, 1, 128);
    t_flash(1, 2, 70000, 70000, 16); /* more (batch, head) pairs than a grid's y takes */
    t_flash_refused();
    nn_cuda_attention_mode(h, attn_mode_now = 2); /* 64 and 128 on the mma.sync kernels too */
    t_flash(2, 257, 32, 8, 64);
    t_flash(2, 63, 9, 3, 64);
    t_flash(2, 1000, 6, 2, 64);
    t_flash(2, 257, 24, 8, 128);
    t_flash(2, 1000, 4, 1, 128);
    nn_cuda_attention_mode(h, attn_mode_now = 0);

    /* Attention over a KV cache (a decoder's step and prefill): head sizes of
     * the tiny models (8, 12, 16), Llama's (64, 128), the largest (256) and an
     * odd one; one query at positions 0 (a single key: three warps idle), 3
     * and 1000; a chunk of 64 queries after 70 cached positions; GQA 4:1, 8:1,
     * 3:1 and multi-head; sharp scores */
    t_attn_cached(0, 1, 8, 2, 64, 1.0f);
    t_attn_cached(3, 1, 8, 2, 64, 1.0f);
    t_attn_cached(1000, 1, 32, 8, 64, 1.0f);
    t_attn_cached(1000, 1, 16, 2, 128, 3.0f);
    t_attn_cached(70, 64, 8, 4, 8, 2.0f);
    t_attn_cached(0, 7, 4, 4, 12, 2.0f);
    t_attn_cached(0, 70, 4, 4, 16, 2.0f);
    t_attn_cached(100, 5, 9, 3, 64, 4.0f);
    t_attn_cached(300, 3, 4, 1, 256, 1.0f);
    t_attn_cached(17, 9, 6, 2, 100, 1.0f);
    t_attn_cached_refused();

timing:
    if (argc > 1 && (strcmp(argv[1], "--bench") == 0 || bench_only)) {
        bench(32, 8, 64, 2048); /* Llama 3.2 1B */
        bench(24, 8, 128, 3072);
    }
    nn_cuda_destroy(h);
    cudaFree(ws);
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
#endif
