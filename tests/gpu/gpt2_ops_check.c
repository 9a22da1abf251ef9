/* tests/gpu/gpt2_ops_check.c — every GPT-2 CUDA layer (nn/ops_cuda.h)
 * against its CPU twin (ops_cpu.h, itself checked against PyTorch in float64).
 *
 * Runs on a machine with a GPU (tests/gpu/test_gpt2_ops.sh). Inputs are fresh
 * random values (never zeros) rounded to bf16 on the host, so both sides see
 * the same numbers; the CPU computes in f32 from them. Device outputs are
 * poisoned (all bits set: NaN) before each call, so an unwritten element fails;
 * f32 parameter gradients start from random values on both sides, which checks
 * that they are added into (+=). The measure is ||cuda - cpu|| / ||cpu|| over a
 * tensor, printed with its bound:
 *   1.5e-2  bf16 outputs of one layer (bf16 rounding of the result, 2^-9 per
 *           element, plus the kernel's f32 order of summation);
 *   3e-2    attention (a bf16 score matrix and softmax between two products);
 *   1e-3    f32 parameter gradients (same bf16 inputs, only f32 sums differ).
 * Sizes are GPT-2's (C 768 and 1600, 12 heads, a vocabulary that is not a
 * multiple of 64 so logits rows are padded). Determinism: the reductions are
 * in a fixed order, so two runs give the same bits. Prints TAP.
 *   --bench [N [d48]] then times each layer at d12's shapes ("#" lines),
 *              or d48's; with N >= 2, the products time N cuBLASLt candidates
 *              per shape first (nn_cuda_gemm_tune)
 *   --ceiling  only prints the bf16 matmul rate ("ceiling_tflops X")
 *   --profile [d48]  no checks: every timed layer once after a warm-up, for
 *              Nsight Compute (bench/gpu/profile.sh's kernel mode)
 */
#include <math.h>
#include <stdarg.h>
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
#include "nn/ops_cpu.h"
#include "nn/ops_cuda.h"

#include "gpu_check.h"

/* ------------------------------------------------------------ the layers */

static void t_encoder(int B, int T, int C, int V)
{
    const size_t N = (size_t)B * T;
    bmt_error_t err;
    int32_t *inp = malloc(N * 4);
    for (size_t i = 0; i < N; i++) /* repeats, so tokens share wte rows */
        inp[i] = (int32_t)(uniform() * (V < 50 ? V : 50));
    float *wte = rnd((size_t)V * C, 0.3f), *wpe = rnd((size_t)T * C, 0.1f);
    float *ref = zeros(N * C);
    nn_encoder_forward(ref, inp, wte, wpe, B, T, C);
    void *dinp = up_i32(inp, N), *dwte = up_bf16(wte, (size_t)V * C),
         *dwpe = up_bf16(wpe, (size_t)T * C);
    void *dout = dmalloc(N * C * 2);
    run(nn_cuda_encoder_forward(h, dout, dinp, dwte, dwpe, B, T, C, &err), "encoder forward", &err);
    float *got = down_bf16(dout, N * C);
    check("encoder forward", got, ref, N * C, 1.5e-2);

    /* backward: += into random gradients */
    float *g = rnd(N * C, 1.0f), *gw = rnd((size_t)V * C, 0.5f), *gp = rnd((size_t)T * C, 0.5f);
    float *rw = copy(gw, (size_t)V * C), *rp = copy(gp, (size_t)T * C);
    nn_encoder_backward(rw, rp, g, inp, B, T, C);
    int32_t *bk = malloc((3 * N + 1) * 4);
    int U = nn_token_buckets(inp, (int)N, V, bk);
    void *dg = up_bf16(g, N * C), *dbk = up_i32(bk, 3 * N + 1);
    float *dgw = up_f32(gw, (size_t)V * C), *dgp = up_f32(gp, (size_t)T * C);
    run(nn_cuda_encoder_backward(h, dgw, dgp, dg, dbk, U, B, T, C, &err), "encoder backward", &err);
    float *gw1 = down_f32(dgw, (size_t)V * C), *gp1 = down_f32(dgp, (size_t)T * C);
    check("encoder backward dwte (+=)", gw1, rw, (size_t)V * C, 1e-3);
    check("encoder backward dwpe (+=)", gp1, rp, (size_t)T * C, 1e-3);
    /* determinism: again from the same start gives the same bits */
    ck(cudaMemcpyAsync(dgw, gw, (size_t)V * C * 4, cudaMemcpyHostToDevice, stream), "upload");
    ck(cudaStreamSynchronize(stream), "upload");
    run(nn_cuda_encoder_backward(h, dgw, dgp, dg, dbk, U, B, T, C, &err), "encoder backward", &err);
    float *gw2 = down_f32(dgw, (size_t)V * C);
    bool same = memcmp(gw1, gw2, (size_t)V * C * 4) == 0;
    printf("%sok %d - encoder backward dwte: the same bits on a second run\n", same ? "" : "not ",
           ++tap_n);
    tap_failed += !same;
    free(inp), free(wte), free(wpe), free(ref), free(got), free(g), free(gw), free(gp), free(rw);
    free(rp), free(bk), free(gw1), free(gp1), free(gw2);
    cudaFree(dinp), cudaFree(dwte), cudaFree(dwpe), cudaFree(dout), cudaFree(dg), cudaFree(dbk);
    cudaFree(dgw), cudaFree(dgp);
}

/* A backward op's weight and bias gradients written with add 0 (fresh
 * gradients) into dmalloc's NaN-filled buffers: downloaded, checked against
 * the CPU's written into zeros (the bias only when bname is given), and freed
 * with their device buffers. */
static void check_fresh_grads(const char *wname, void *dgw, const float *rgw, size_t nw,
                              const char *bname, void *dgb, const float *rgb, size_t nb)
{
    float *gw = down_f32(dgw, nw), *gb = down_f32(dgb, nb);
    check(wname, gw, rgw, nw, 1e-3);
    if (bname)
        check(bname, gb, rgb, nb, 1e-3);
    free(gw), free(gb);
    cudaFree(dgw), cudaFree(dgb);
}

static void t_layernorm(int N, int C)
{
    bmt_error_t err;
    char name[96];
    float *x = rnd((size_t)N * C, 2.0f), *w = rnd(C, 1.0f), *b = rnd(C, 0.5f);
    for (size_t i = 0; i < (size_t)N * C; i++) /* a per-row offset: the mean matters */
        x[i] = bf16r(x[i] + (float)(i / C % 7) - 3.0f);
    float *ref = zeros((size_t)N * C), *rm = zeros(N), *rr = zeros(N);
    nn_layernorm_forward(ref, rm, rr, x, w, b, N, C);
    void *dx = up_bf16(x, (size_t)N * C), *dw = up_bf16(w, C), *db = up_bf16(b, C);
    void *dout = dmalloc((size_t)N * C * 2);
    float *dm = dmalloc((size_t)N * 4), *dr = dmalloc((size_t)N * 4);
    run(nn_cuda_layernorm_forward(h, dout, dm, dr, dx, dw, db, N, C, &err), "layernorm forward",
        &err);
    float *got = down_bf16(dout, (size_t)N * C), *gm = down_f32(dm, N), *gr = down_f32(dr, N);
    snprintf(name, sizeof(name), "layernorm forward (N %d, C %d)", N, C);
    check(name, got, ref, (size_t)N * C, 1.5e-2);
    snprintf(name, sizeof(name), "layernorm forward mean and rstd (C %d)", C);
    double e = fmax(rel(gm, rm, N), rel(gr, rr, N));
    printf("%sok %d - %s: rel err %.3g (bound 1e-5)\n", e <= 1e-5 ? "" : "not ", ++tap_n, name, e);
    tap_failed += !(e <= 1e-5);

    /* backward: dinp = dres + ..., dweight/dbias += ; the CPU's statistics on both sides */
    float *dy = rnd((size_t)N * C, 1.0f), *dres = rnd((size_t)N * C, 1.0f);
    float *gw = rnd(C, 1.0f), *gb = rnd(C, 1.0f);
    float *rdx = copy(dres, (size_t)N * C), *rgw = copy(gw, C), *rgb = copy(gb, C);
    nn_layernorm_backward(rdx, rgw, rgb, dy, x, w, rm, rr, N, C);
    void *ddy = up_bf16(dy, (size_t)N * C), *ddres = up_bf16(dres, (size_t)N * C);
    void *ddx = dmalloc((size_t)N * C * 2);
    float *dgw = up_f32(gw, C), *dgb = up_f32(gb, C), *dcm = up_f32(rm, N), *dcr = up_f32(rr, N);
    run(nn_cuda_layernorm_backward(h, ddx, ddres, dgw, dgb, ddy, dx, dw, dcm, dcr, N, C, 1, &err),
        "layernorm backward", &err);
    float *gdx = down_bf16(ddx, (size_t)N * C), *ggw = down_f32(dgw, C), *ggb = down_f32(dgb, C);
    snprintf(name, sizeof(name), "layernorm backward dinp = dres + ... (C %d)", C);
    check(name, gdx, rdx, (size_t)N * C, 1.5e-2);
    check("layernorm backward dweight (+=)", ggw, rgw, C, 1e-3);
    check("layernorm backward dbias (+=)", ggb, rgb, C, 1e-3);
    /* add 0 (fresh gradients): = into NaN-filled (dmalloc's poison) buffers */
    float *rgw0 = zeros(C), *rgb0 = zeros(C), *rdx0 = copy(dres, (size_t)N * C);
    nn_layernorm_backward(rdx0, rgw0, rgb0, dy, x, w, rm, rr, N, C);
    float *dgw0 = dmalloc((size_t)C * 4), *dgb0 = dmalloc((size_t)C * 4);
    run(nn_cuda_layernorm_backward(h, ddx, ddres, dgw0, dgb0, ddy, dx, dw, dcm, dcr, N, C, 0, &err),
        "layernorm backward", &err);
    check_fresh_grads("layernorm backward dweight (=, into NaN)", dgw0, rgw0, C,
                      "layernorm backward dbias (=, into NaN)", dgb0, rgb0, C);
    free(rgw0), free(rgb0), free(rdx0);
    /* in place: dres == dinp, as the layers use it */
    run(nn_cuda_layernorm_backward(h, ddres, ddres, dgw, dgb, ddy, dx, dw, dcm, dcr, N, C, 1, &err),
        "layernorm backward", &err);
    float *gip = down_bf16(ddres, (size_t)N * C);
    check("layernorm backward in place (dinp == dres)", gip, rdx, (size_t)N * C, 1.5e-2);
    free(x), free(w), free(b), free(ref), free(rm), free(rr), free(got), free(gm), free(gr);
    free(dy), free(dres), free(gw), free(gb), free(rdx), free(rgw), free(rgb), free(gdx);
    free(ggw), free(ggb), free(gip);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout), cudaFree(dm), cudaFree(dr);
    cudaFree(ddy), cudaFree(ddres), cudaFree(ddx), cudaFree(dgw), cudaFree(dgb), cudaFree(dcm);
    cudaFree(dcr);
}

/* wt 0: W (IC,OC) with bias; wt 1: W (OC,IC), output rows ld apart (padded). */
static void t_matmul(int N, int IC, int OC, int wt, int ld)
{
    bmt_error_t err;
    char name[128];
    const size_t nw = (size_t)IC * OC;
    float *x = rnd((size_t)N * IC, 1.0f), *w = rnd(nw, 0.05f), *b = wt ? NULL : rnd(OC, 0.5f);
    float *ref = zeros((size_t)N * OC);
    nn_conv1d_forward(ref, x, w, b, N, IC, OC, wt);
    void *dx = up_bf16(x, (size_t)N * IC), *dw = up_bf16(w, nw), *db = b ? up_bf16(b, OC) : NULL;
    void *dout = dmalloc((size_t)N * ld * 2);
    run(nn_cuda_matmul_forward(h, dout, ld, dx, dw, db, N, IC, OC, wt, &err), "matmul forward",
        &err);
    float *raw = down_bf16(dout, (size_t)N * ld), *got = zeros((size_t)N * OC);
    for (int n = 0; n < N; n++)
        memcpy(got + (size_t)n * OC, raw + (size_t)n * ld, (size_t)OC * 4);
    snprintf(name, sizeof(name), "matmul forward (N %d, IC %d, OC %d, %s, ld %d)", N, IC, OC,
             wt ? "W (OC,IC)" : "W (IC,OC) + bias", ld);
    check(name, got, ref, (size_t)N * OC, 1.5e-2);

    /* backward: dout with rows ld apart */
    float *dy = rnd((size_t)N * OC, 1.0f), *gw = rnd(nw, 1.0f), *gb = rnd(OC, 1.0f);
    float *rdx = zeros((size_t)N * IC), *rgw = copy(gw, nw), *rgb = copy(gb, OC);
    nn_conv1d_backward(rdx, rgw, wt ? NULL : rgb, dy, x, w, N, IC, OC, wt);
    float *dyp = zeros((size_t)N * ld);
    for (int n = 0; n < N; n++)
        memcpy(dyp + (size_t)n * ld, dy + (size_t)n * OC, (size_t)OC * 4);
    void *ddy = up_bf16(dyp, (size_t)N * ld), *ddx = dmalloc((size_t)N * IC * 2);
    float *dgw = up_f32(gw, nw), *dgb = up_f32(gb, OC);
    run(nn_cuda_matmul_backward(h, ddx, dgw, wt ? NULL : dgb, ddy, ld, dx, dw, N, IC, OC, wt, 1,
                                &err),
        "matmul backward", &err);
    float *gdx = down_bf16(ddx, (size_t)N * IC), *ggw = down_f32(dgw, nw), *ggb = down_f32(dgb, OC);
    snprintf(name, sizeof(name), "matmul backward dinp (IC %d, OC %d, wt %d)", IC, OC, wt);
    check(name, gdx, rdx, (size_t)N * IC, 1.5e-2);
    snprintf(name, sizeof(name), "matmul backward dweight += (IC %d, OC %d, wt %d)", IC, OC, wt);
    check(name, ggw, rgw, nw, 1e-3);
    if (!wt)
        check("matmul backward dbias (+=)", ggb, rgb, OC, 1e-3);
    /* add 0 (fresh gradients): = into NaN-filled (dmalloc's poison) buffers */
    float *rgw0 = zeros(nw), *rgb0 = zeros(OC), *rdx0 = zeros((size_t)N * IC);
    nn_conv1d_backward(rdx0, rgw0, wt ? NULL : rgb0, dy, x, w, N, IC, OC, wt);
    float *dgw0 = dmalloc(nw * 4), *dgb0 = dmalloc((size_t)OC * 4);
    run(nn_cuda_matmul_backward(h, NULL, dgw0, wt ? NULL : dgb0, ddy, ld, dx, dw, N, IC, OC, wt, 0,
                                &err),
        "matmul backward", &err);
    snprintf(name, sizeof(name), "matmul backward dweight = (into NaN; IC %d, OC %d, wt %d)", IC,
             OC, wt);
    check_fresh_grads(name, dgw0, rgw0, nw, wt ? NULL : "matmul backward dbias (=, into NaN)", dgb0,
                      rgb0, OC);
    free(rgw0), free(rgb0), free(rdx0);
    free(x), free(w), free(b), free(ref), free(raw), free(got), free(dy), free(gw), free(gb);
    free(rdx), free(rgw), free(rgb), free(dyp), free(gdx), free(ggw), free(ggb);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout), cudaFree(ddy), cudaFree(ddx);
    cudaFree(dgw), cudaFree(dgb);
}

/* out = res + inp x W (+ bias) in one product (cuBLASLt's C input), against
 * the CPU's product and residual add; into a fresh buffer and in place
 * (out == res). Shapes that split the product (m, n or k not a multiple of
 * 64) take the residual into their first part only. */
static void t_matmul_residual(int N, int IC, int OC, int wt)
{
    bmt_error_t err;
    char name[160];
    const size_t nw = (size_t)IC * OC, no = (size_t)N * OC;
    float *x = rnd((size_t)N * IC, 1.0f), *w = rnd(nw, 0.05f), *b = wt ? NULL : rnd(OC, 0.5f);
    float *r = rnd(no, 1.0f), *prod = zeros(no), *ref = zeros(no);
    nn_conv1d_forward(prod, x, w, b, N, IC, OC, wt);
    nn_residual_forward(ref, r, prod, (int)no);
    void *dx = up_bf16(x, (size_t)N * IC), *dw = up_bf16(w, nw), *db = b ? up_bf16(b, OC) : NULL;
    void *dr = up_bf16(r, no), *dout = dmalloc(no * 2);
    poison(dout, no * 2);
    run(nn_cuda_matmul_residual_forward(h, dout, dr, dx, dw, db, N, IC, OC, wt, &err),
        "matmul residual forward", &err);
    float *got = down_bf16(dout, no);
    snprintf(name, sizeof(name), "matmul + residual in one product (N %d, IC %d, OC %d, %s)", N, IC,
             OC, wt ? "W (OC,IC)" : "W (IC,OC) + bias");
    check(name, got, ref, no, 1.5e-2);
    float *r0 = down_bf16(dr, no);
    check_same("matmul + residual: res untouched", r0, r, no);
    /* In place (out == res): cuBLASLt may take another kernel when C is D,
     * so against the CPU again, and the same bits on a second in-place run. */
    run(nn_cuda_matmul_residual_forward(h, dr, dr, dx, dw, db, N, IC, OC, wt, &err),
        "matmul residual forward in place", &err);
    float *got2 = down_bf16(dr, no);
    snprintf(name, sizeof(name), "matmul + residual in place (out == res, N %d, IC %d, OC %d)", N,
             IC, OC);
    check(name, got2, ref, no, 1.5e-2);
    put_bf16(dr, r, no);
    run(nn_cuda_matmul_residual_forward(h, dr, dr, dx, dw, db, N, IC, OC, wt, &err),
        "matmul residual forward in place", &err);
    float *got3 = down_bf16(dr, no);
    check_same("matmul + residual in place: the same bits on a second run", got3, got2, no);
    free(x), free(w), free(b), free(r), free(prod), free(ref), free(got), free(r0), free(got2),
        free(got3);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dr), cudaFree(dout);
}

/* The MLP's products with GELU in cuBLASLt's epilogue: forward out = GELU(x W1
 * + b1) with the pre-activation saved, backward dinp = (dout W2^T) GELU'(pre),
 * against the CPU's product and GELU (the backward's reference reads the
 * pre-activation the GPU saved, so the bound measures the fused backward alone). */
static void t_matmul_gelu(int N, int IC, int OC)
{
    bmt_error_t err;
    char name[128];
    const size_t n1 = (size_t)N * OC, nw = (size_t)IC * OC;
    float *x = rnd((size_t)N * IC, 1.0f), *w = rnd(nw, 0.05f), *b = rnd(OC, 0.5f);
    float *rpre = zeros(n1), *rout = zeros(n1);
    nn_conv1d_forward(rpre, x, w, b, N, IC, OC, 0);
    nn_gelu_forward(rout, rpre, (int)n1);
    void *dx = up_bf16(x, (size_t)N * IC), *dw = up_bf16(w, nw), *db = up_bf16(b, OC);
    void *dout = dmalloc(n1 * 2), *dpre = dmalloc(n1 * 2);
    run(nn_cuda_matmul_gelu_forward(h, dout, dpre, dx, dw, db, N, IC, OC, &err),
        "matmul + gelu forward", &err);
    float *gout = down_bf16(dout, n1), *gpre = down_bf16(dpre, n1);
    snprintf(name, sizeof(name), "matmul + GELU epilogue forward (N %d, IC %d, OC %d)", N, IC, OC);
    check(name, gout, rout, n1, 1.5e-2);
    check("matmul + GELU epilogue forward: the pre-activation", gpre, rpre, n1, 1.5e-2);

    /* backward of a projection W2 (OC -> IC) whose input was that GELU's output */
    float *w2 = rnd(nw, 0.05f), *b2 = rnd(IC, 0.5f), *dy = rnd((size_t)N * IC, 1.0f);
    float *gw = rnd(nw, 1.0f), *gb = rnd(IC, 1.0f), *rgw = copy(gw, nw), *rgb = copy(gb, IC);
    float *t = zeros(n1), *rdx = zeros(n1);
    nn_conv1d_backward(t, rgw, rgb, dy, gout, w2, N, OC, IC, 0);
    nn_gelu_backward(rdx, gpre, t, (int)n1);
    void *dw2 = up_bf16(w2, nw), *ddy = up_bf16(dy, (size_t)N * IC), *ddx = dmalloc(n1 * 2);
    float *dgw = up_f32(gw, nw), *dgb = up_f32(gb, IC);
    run(nn_cuda_matmul_backward_dgelu(h, ddx, dgw, dgb, ddy, IC, dout, dw2, dpre, N, OC, IC, 1,
                                      &err),
        "matmul backward + dgelu", &err);
    float *gdx = down_bf16(ddx, n1), *ggw = down_f32(dgw, nw), *ggb = down_f32(dgb, IC);
    snprintf(name, sizeof(name), "matmul backward, GELU' epilogue: dinp (N %d, IC %d, OC %d)", N,
             OC, IC);
    check(name, gdx, rdx, n1, 1.5e-2);
    check("matmul backward, GELU' epilogue: dweight (+=)", ggw, rgw, nw, 1e-3);
    check("matmul backward, GELU' epilogue: dbias (+=)", ggb, rgb, IC, 1e-3);
    float *rgw0 = zeros(nw), *rgb0 = zeros(IC), *t0 = zeros(n1);
    nn_conv1d_backward(t0, rgw0, rgb0, dy, gout, w2, N, OC, IC, 0);
    float *dgw0 = dmalloc(nw * 4), *dgb0 = dmalloc((size_t)IC * 4);
    run(nn_cuda_matmul_backward_dgelu(h, ddx, dgw0, dgb0, ddy, IC, dout, dw2, dpre, N, OC, IC, 0,
                                      &err),
        "matmul backward + dgelu", &err);
    check_fresh_grads("matmul backward, GELU' epilogue: dweight (=, into NaN)", dgw0, rgw0, nw,
                      "matmul backward, GELU' epilogue: dbias (=, into NaN)", dgb0, rgb0, IC);
    free(rgw0), free(rgb0), free(t0);
    free(x), free(w), free(b), free(rpre), free(rout), free(gout), free(gpre), free(w2), free(b2);
    free(dy), free(gw), free(gb), free(rgw), free(rgb), free(t), free(rdx), free(gdx), free(ggw);
    free(ggb);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout), cudaFree(dpre), cudaFree(dw2);
    cudaFree(ddy), cudaFree(ddx), cudaFree(dgw), cudaFree(dgb);
}

static int attn_mode_now; /* what nn_cuda_attention_mode was given last */

static void t_attention(int B, int T, int C, int NH)
{
    bmt_error_t err;
    char name[96];
    const size_t N = (size_t)B * T, att = (size_t)B * NH * T * T;
    float *qkv = rnd(N * 3 * C, 1.0f);
    float *ref = zeros(N * C), *pre = zeros(att), *ratt = zeros(att);
    nn_attention_qkv_forward(ref, pre, ratt, qkv, B, T, C, NH);
    void *dqkv = up_bf16(qkv, N * 3 * C), *dout = dmalloc(N * C * 2),
         *dqkvr = dmalloc(N * 3 * C * 2);
    const bool flash = nn_cuda_attention_is_flash(C, NH);
    void *datt = dmalloc(nn_cuda_attention_saved_bytes(B, T, C, NH));
    void *scratch = dmalloc(4 * N * C * 2);
    run(nn_cuda_attention_forward(h, dout, dqkvr, datt, dqkv, scratch, B, T, C, NH, &err),
        "attention forward", &err);
    float *got = down_bf16(dout, N * C), *gatt = NULL;
    const char *kind = !flash                                              ? "materialized"
                       : C / NH != 64 || attn_mode_now == 2                ? "flash, mma.sync"
                       : strcmp(nn_cuda_attention_kernel(h), "wgmma") == 0 ? "flash, wgmma"
                                                                           : "flash, mma.sync";
    snprintf(name, sizeof(name), "attention forward (B %d, T %d, C %d, NH %d, %s)", B, T, C, NH,
             kind);
    check(name, got, ref, N * C, 3e-2);
    if (flash) { /* att holds the log-sum-exp of each row: check it against the CPU's scores */
        float *lse = down_f32(datt, (size_t)B * NH * T), *rl = zeros((size_t)B * NH * T);
        for (size_t r = 0; r < (size_t)B * NH * T; r++) {
            const size_t t = r % T;
            double mx = -INFINITY, s = 0;
            for (size_t j = 0; j <= t; j++)
                mx = fmax(mx, pre[r * T + j]);
            for (size_t j = 0; j <= t; j++)
                s += exp(pre[r * T + j] - mx);
            rl[r] = (float)(mx + log(s));
        }
        check("flash attention forward: log-sum-exp per row", lse, rl, (size_t)B * NH * T, 1e-3);
        free(lse), free(rl);
        /* as the model calls it: qkv saved where it lies (qkvr == qkv), no scratch */
        void *out2 = dmalloc(N * C * 2);
        ck(cudaMemsetAsync(out2, 0xff, N * C * 2, stream), "poison");
        ck(cudaStreamSynchronize(stream), "poison");
        run(nn_cuda_attention_forward(h, out2, dqkv, datt, dqkv, NULL, B, T, C, NH, &err),
            "attention forward in place", &err);
        float *got2 = down_bf16(out2, N * C);
        const bool same = memcmp(got, got2, N * C * sizeof(float)) == 0;
        printf("%sok %d - flash attention forward with qkvr == qkv, no scratch: the same bits\n",
               same ? "" : "not ", ++tap_n);
        tap_failed += !same;
        free(got2);
        cudaFree(out2);
    } else {
        gatt = down_bf16(datt, att);
        check("attention forward: softmax, 0 above the diagonal", gatt, ratt, att, 3e-2);
    }

    float *dy = rnd(N * C, 1.0f), *rdq = zeros(N * 3 * C), *s1 = zeros(att), *s2 = zeros(att);
    nn_attention_qkv_backward(rdq, s1, s2, dy, qkv, ratt, B, T, C, NH);
    void *ddy = up_bf16(dy, N * C), *ddq = dmalloc(N * 3 * C * 2);
    void *ddatt = dmalloc(nn_cuda_attention_saved_bytes(B, T, C, NH));
    run(nn_cuda_attention_backward(h, ddq, ddy, dout, dqkvr, datt, ddatt, scratch, B, T, C, NH,
                                   &err),
        "attention backward", &err);
    float *gdq = down_bf16(ddq, N * 3 * C);
    snprintf(name, sizeof(name), "attention backward dqkv (%s)", kind);
    check(name, gdq, rdq, N * 3 * C, 3e-2);
    /* the same bits on a second run (no atomics) */
    ck(cudaMemsetAsync(ddq, 0xff, N * 3 * C * 2, stream), "poison");
    ck(cudaStreamSynchronize(stream), "poison");
    run(nn_cuda_attention_backward(h, ddq, ddy, dout, dqkvr, datt, ddatt, scratch, B, T, C, NH,
                                   &err),
        "attention backward", &err);
    float *gdq2 = down_bf16(ddq, N * 3 * C);
    const bool same = memcmp(gdq, gdq2, N * 3 * C * sizeof(float)) == 0;
    printf("%sok %d - attention backward: the same bits on a second run\n", same ? "" : "not ",
           ++tap_n);
    tap_failed += !same;
    free(gdq2);
    free(qkv), free(ref), free(pre), free(ratt), free(got), free(gatt), free(dy), free(rdq);
    free(s1), free(s2), free(gdq);
    cudaFree(dqkv), cudaFree(dout), cudaFree(dqkvr), cudaFree(datt), cudaFree(scratch);
    cudaFree(ddy), cudaFree(ddq), cudaFree(ddatt);
}

static void t_elementwise(size_t n)
{
    bmt_error_t err;
    float *x = rnd(n, 2.0f), *y = rnd(n, 1.0f), *ref = zeros(n);
    void *dx = up_bf16(x, n), *dy = up_bf16(y, n), *dout = dmalloc(n * 2);
    nn_gelu_forward(ref, x, (int)n);
    run(nn_cuda_gelu_forward(h, dout, dx, n, &err), "gelu forward", &err);
    float *got = down_bf16(dout, n);
    check("gelu forward", got, ref, n, 1.5e-2);
    free(got);
    memset(ref, 0, n * 4);
    nn_gelu_backward(ref, x, y, (int)n);
    ck(cudaMemsetAsync(dout, 0xff, n * 2, stream), "poison");
    ck(cudaStreamSynchronize(stream), "poison");
    run(nn_cuda_gelu_backward(h, dout, dx, dy, n, &err), "gelu backward", &err);
    got = down_bf16(dout, n);
    check("gelu backward", got, ref, n, 1.5e-2);
    free(got);
    run(nn_cuda_gelu_backward(h, dy, dx, dy, n, &err), "gelu backward", &err);
    got = down_bf16(dy, n);
    check("gelu backward in place (dinp == dout)", got, ref, n, 1.5e-2);
    free(got);
    void *dy2 = up_bf16(y, n);
    nn_residual_forward(ref, x, y, (int)n);
    ck(cudaMemsetAsync(dout, 0xff, n * 2, stream), "poison");
    ck(cudaStreamSynchronize(stream), "poison");
    run(nn_cuda_residual_forward(h, dout, dx, dy2, n, &err), "residual", &err);
    got = down_bf16(dout, n);
    check("residual forward", got, ref, n, 1.5e-2);
    free(got);
    free(x), free(y), free(ref);
    cudaFree(dx), cudaFree(dy), cudaFree(dy2), cudaFree(dout);
}

static void t_crossentropy(int N, int V, int ld)
{
    bmt_error_t err;
    char name[96];
    float *logits = rnd((size_t)N * V, 3.0f);
    int32_t *tg = malloc((size_t)N * 4);
    int counted = 0;
    for (int i = 0; i < N; i++) {
        tg[i] = i % 5 == 3 ? -1 : (int32_t)(uniform() * V);
        counted += tg[i] >= 0;
    }
    const float dloss = 1.0f / (float)counted;
    float *rl = zeros(N), *probs = zeros((size_t)N * V), *rd = zeros((size_t)N * V);
    nn_crossentropy_forward(rl, probs, logits, tg, 1, N, V);
    nn_crossentropy_backward(rd, probs, tg, dloss, 1, N, V);
    float *lp = zeros((size_t)N * ld);
    for (int n = 0; n < N; n++)
        memcpy(lp + (size_t)n * ld, logits + (size_t)n * V, (size_t)V * 4);
    void *dl = up_bf16(lp, (size_t)N * ld), *dtg = up_i32(tg, N);
    float *dlosses = dmalloc((size_t)N * 4), *dsum = dmalloc(4);
    run(nn_cuda_crossentropy(h, dlosses, dl, ld, dtg, dloss, N, V, &err), "cross-entropy", &err);
    run(nn_cuda_sum(h, dsum, dlosses, N, &err), "sum", &err);
    float *gl = down_f32(dlosses, N), *graw = down_bf16(dl, (size_t)N * ld),
          *gs = down_f32(dsum, 1);
    float *gd = zeros((size_t)N * V);
    bool pad_zero = true;
    for (int n = 0; n < N; n++) {
        memcpy(gd + (size_t)n * V, graw + (size_t)n * ld, (size_t)V * 4);
        for (int j = V; j < ld; j++)
            pad_zero &= graw[(size_t)n * ld + j] == 0.0f;
    }
    snprintf(name, sizeof(name), "cross-entropy losses (N %d, V %d, ld %d, ignored targets)", N, V,
             ld);
    check(name, gl, rl, N, 1e-2);
    check("cross-entropy fused backward: dlogits in place", gd, rd, (size_t)N * V, 1.5e-2);
    printf("%sok %d - cross-entropy: the padding columns V..ld are 0\n", pad_zero ? "" : "not ",
           ++tap_n);
    tap_failed += !pad_zero;
    double s = 0;
    for (int n = 0; n < N; n++)
        s += rl[n];
    float want = (float)s;
    check("sum of the losses", gs, &want, 1, 1e-5);
    free(logits), free(tg), free(rl), free(probs), free(rd), free(lp), free(gl), free(graw);
    free(gs), free(gd);
    cudaFree(dl), cudaFree(dtg), cudaFree(dlosses), cudaFree(dsum);
}

/* ------------------------------------------------------------ timing (--bench)
 *
 * Diagnostics, not tests: each layer at GPT-2 d12's shapes (B 16, T 1024, C 768,
 * 12 heads, V 50257), the median of 20 runs timed with events, and the
 * figures of one training step (forward, recomputation under activation
 * checkpointing excluded, backward) of 12 layers and the head. Prints "#" lines.
 */
static int timed_runs = 20; /* 1 under --profile (ncu replays each launch anyway) */

static float time_ms(void (*fn)(void *), void *arg)
{
    cudaEvent_t a, b;
    float t[20];
    const int n = timed_runs;
    ck(cudaEventCreate(&a), "event");
    ck(cudaEventCreate(&b), "event");
    fn(arg); /* warm-up */
    for (int i = 0; i < n; i++) {
        ck(cudaEventRecord(a, stream), "event");
        fn(arg);
        ck(cudaEventRecord(b, stream), "event");
        ck(cudaEventSynchronize(b), "event");
        ck(cudaEventElapsedTime(&t[i], a, b), "event");
    }
    for (int i = 0; i < n; i++) /* sort for the median */
        for (int j = i + 1; j < n; j++)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j], t[j] = x;
            }
    cudaEventDestroy(a), cudaEventDestroy(b);
    return (t[(n - 1) / 2] + t[n / 2]) / 2;
}

typedef struct bench_bufs {
    int B, T, C, NH, V, Vp, N, op, flash;
    void *x, *y, *qkv, *qkvr, *att, *datt, *scratch, *big, *dbig, *w, *bias, *logits;
    float *mean, *rstd, *gw, *gb, *gwbig, *losses;
    int32_t *tok;
} bench_bufs_t;

static void bench_op(void *arg)
{
    bench_bufs_t *z = arg;
    bmt_error_t err;
    const int N = z->N, C = z->C;
    int rc = 0;
    switch (z->op) {
    case 0:
        rc = nn_cuda_layernorm_forward(h, z->y, z->mean, z->rstd, z->x, z->w, z->bias, N, C, &err);
        break;
    case 1:
        rc = nn_cuda_layernorm_backward(h, z->y, z->y, z->gw, z->gb, z->x, z->x, z->w, z->mean,
                                        z->rstd, N, C, 1, &err);
        break;
    case 2:
        rc = nn_cuda_matmul_forward(h, z->qkv, 3 * C, z->x, z->w, z->bias, N, C, 3 * C, 0, &err);
        break;
    case 3:
        rc = nn_cuda_matmul_backward(h, z->x, z->gwbig, z->gb, z->qkv, 3 * C, z->y, z->w, N, C,
                                     3 * C, 0, 1, &err);
        break;
    case 4:
        rc = nn_cuda_matmul_forward(h, z->big, 4 * C, z->x, z->w, z->bias, N, C, 4 * C, 0, &err);
        break;
    case 5:
        rc = nn_cuda_matmul_backward(h, z->x, z->gwbig, z->gb, z->big, 4 * C, z->y, z->w, N, C,
                                     4 * C, 0, 1, &err);
        break;
    case 6:
        rc = nn_cuda_matmul_forward(h, z->y, C, z->big, z->w, z->bias, N, 4 * C, C, 0, &err);
        break;
    case 7:
        rc = nn_cuda_matmul_backward(h, z->dbig, z->gwbig, z->gb, z->y, C, z->big, z->w, N, 4 * C,
                                     C, 0, 1, &err);
        break;
    case 8: rc = nn_cuda_matmul_forward(h, z->y, C, z->x, z->w, z->bias, N, C, C, 0, &err); break;
    case 9:
        rc = nn_cuda_matmul_backward(h, z->x, z->gwbig, z->gb, z->y, C, z->x, z->w, N, C, C, 0, 1,
                                     &err);
        break;
    case 10: /* as the trainer calls it: the flash kernels' saved input is qkv itself (no copy) */
        rc = nn_cuda_attention_forward(h, z->y, z->flash ? z->qkv : z->qkvr, z->att, z->qkv,
                                       z->scratch, z->B, z->T, C, z->NH, &err);
        break;
    case 11:
        rc = nn_cuda_attention_backward(h, z->dbig, z->x, z->y, z->flash ? z->qkv : z->qkvr, z->att,
                                        z->datt, z->scratch, z->B, z->T, C, z->NH, &err);
        break;
    case 12: rc = nn_cuda_gelu_forward(h, z->dbig, z->big, (size_t)N * 4 * C, &err); break;
    case 13:
        rc = nn_cuda_gelu_backward(h, z->dbig, z->big, z->dbig, (size_t)N * 4 * C, &err);
        break;
    case 14: rc = nn_cuda_residual_forward(h, z->y, z->x, z->y, (size_t)N * C, &err); break;
    case 15:
        rc = nn_cuda_matmul_forward(h, z->logits, z->Vp, z->x, z->w, NULL, N, C, z->V, 1, &err);
        break;
    case 16:
        rc = nn_cuda_crossentropy(h, z->losses, z->logits, z->Vp, z->tok, 1e-4f, N, z->V, &err);
        break;
    case 17:
        rc = nn_cuda_matmul_backward(h, z->x, z->gwbig, NULL, z->logits, z->Vp, z->y, z->w, N, C,
                                     z->V, 1, 1, &err);
        break;
    }
    if (rc < 0)
        die("bench", err.text);
}

/* --ceiling: the bf16 matmul rate this GPU reaches through the same cuBLASLt
 * call as the model (random data, 8192^3, median of 20), printed as
 * "ceiling_tflops X": what bench/gpu/gpt2.sh reports MFU against besides the
 * datasheet's peak. */
static void gemm_op(void *arg)
{
    void **b = arg;
    bmt_error_t err;
    if (nn_cuda_matmul_forward(h, b[0], 8192, b[1], b[2], NULL, 8192, 8192, 8192, 1, &err) < 0)
        die("ceiling matmul", err.text);
}

static void ceiling(void)
{
    const size_t n = (size_t)8192 * 8192;
    float *r = rnd(n, 1.0f);
    void *b[3] = { dmalloc(n * 2), up_bf16(r, n), up_bf16(r, n) };
    const float ms = time_ms(gemm_op, b);
    printf("ceiling_tflops %.1f\n", 2.0 * 8192 * 8192 * 8192 / (ms * 1e-3) / 1e12);
    free(r);
    cudaFree(b[0]), cudaFree(b[1]), cudaFree(b[2]);
}

/* d48: GPT-2 XL's layer shapes at its micro-batch (B 8, C 1600, 25 heads, 48 layers) */
static void bench(bool d48)
{
    bench_bufs_t z = { .B = 16, .T = 1024, .C = 768, .NH = 12, .V = 50257, .Vp = 50304 };
    const int L = d48 ? 48 : 12;
    if (d48)
        z.B = 8, z.C = 1600, z.NH = 25;
    const size_t N = (size_t)z.B * z.T, C = z.C;
    const size_t att = (size_t)z.B * z.NH * z.T * z.T * 2;
    z.N = (int)N;
    z.flash = nn_cuda_attention_is_flash(z.C, z.NH);
    /* the random values every buffer is made from: the largest is (N, 4C) or (V, C) */
    float *r = rnd(N * 4 > (size_t)z.V ? N * 4 * C : (size_t)z.V * C, 1.0f);
    int32_t *tok = malloc(N * 4);
    for (size_t i = 0; i < N; i++)
        tok[i] = (int32_t)(uniform() * z.V);
    z.x = up_bf16(r, N * C), z.y = up_bf16(r, N * C), z.qkv = up_bf16(r, N * 3 * C);
    z.qkvr = up_bf16(r, N * 3 * C), z.big = up_bf16(r, N * 4 * C), z.dbig = up_bf16(r, N * 4 * C);
    z.w = up_bf16(r, (size_t)z.V * C), z.bias = up_bf16(r, 4 * C);
    z.att = dmalloc(att), z.datt = dmalloc(att), z.scratch = dmalloc(4 * N * C * 2);
    z.logits = dmalloc(N * z.Vp * 2), z.mean = up_f32(r, N), z.rstd = up_f32(r, N);
    z.gw = up_f32(r, 4 * C), z.gb = up_f32(r, 4 * C), z.gwbig = up_f32(r, (size_t)z.V * C);
    z.losses = dmalloc(N * 4), z.tok = up_i32(tok, N);
    for (size_t i = 0; i < N; i++) /* sane LayerNorm statistics */
        r[i] = 1.0f;
    ck(cudaMemcpyAsync(z.rstd, r, N * 4, cudaMemcpyHostToDevice, stream), "upload");
    ck(cudaStreamSynchronize(stream), "upload");
    static const struct {
        const char *name;
        int op, per_layer; /* times per layer in a step (0: once, the head) */
        double flop;       /* useful flops in units of N C^2 (products), B T^2 C (attention) */
    } ops[] = {
        { "layernorm fwd", 0, 2, 0 },
        { "layernorm bwd", 1, 2, 0 },
        { "matmul c_attn fwd", 2, 1, 6 },
        { "matmul c_attn bwd", 3, 1, 12 },
        { "matmul c_fc fwd", 4, 1, 8 },
        { "matmul c_fc bwd", 5, 1, 16 },
        { "matmul mlp c_proj fwd", 6, 1, 8 },
        { "matmul mlp c_proj bwd", 7, 1, 16 },
        { "matmul attn c_proj fwd", 8, 1, 2 },
        { "matmul attn c_proj bwd", 9, 1, 4 },
        { "attention fwd (flash)", 10, 1, 2 }, /* causal: half of 4 B T^2 C */
        { "attention bwd (flash)", 11, 1, 5 }, /* 2.5 times the forward's */
        { "gelu fwd", 12, 1, 0 },
        { "gelu bwd", 13, 1, 0 },
        { "residual", 14, 2, 0 },
        { "head matmul fwd", 15, 0, 0 },
        { "cross-entropy fused", 16, 0, 0 },
        { "head matmul bwd", 17, 0, 0 },
    };
    double layer = 0, head = 0;
    printf("# timing at %s shapes (B %d, T 1024, C %d, NH %d, V 50257), median of 20\n",
           d48 ? "d48" : "d12", z.B, z.C, z.NH);
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        z.op = ops[i].op;
        float ms = time_ms(bench_op, &z);
        double f = ops[i].op >= 10 && ops[i].op <= 11 ? ops[i].flop * z.B * z.T * (double)z.T * z.C
                   : ops[i].op == 15                  ? 2.0 * N * C * z.V
                   : ops[i].op == 17                  ? 4.0 * N * C * z.V
                                                      : ops[i].flop * N * (double)C * C;
        char rate[40] = "";
        if (f > 0)
            snprintf(rate, sizeof(rate), " %6.0f TFLOP/s", f / (ms * 1e-3) / 1e12);
        printf("#   %-26s %8.3f ms%s%s\n", ops[i].name, ms, rate,
               ops[i].per_layer > 1 ? " (x2 per layer)" : "");
        if (ops[i].per_layer)
            layer += ms * ops[i].per_layer;
        else
            head += ms;
    }
    nn_cuda_attention_mode(h, 1);
    z.flash = 0;
    z.op = 10;
    float mf = time_ms(bench_op, &z);
    z.op = 11;
    float mb = time_ms(bench_op, &z);
    printf("#   attention fwd (materialized) %6.3f ms, bwd %6.3f ms\n", mf, mb);
    nn_cuda_attention_mode(h, 2);
    z.flash = 1;
    z.op = 10;
    mf = time_ms(bench_op, &z);
    z.op = 11;
    mb = time_ms(bench_op, &z);
    printf("#   attention fwd (flash, mma.sync) %6.3f ms, bwd %6.3f ms; mode 0 ran %s\n", mf, mb,
           nn_cuda_attention_kernel(h));
    nn_cuda_attention_mode(h, 0);
    printf("# one layer %.2f ms; %d layers + head: %.1f ms per step (without recomputation)\n",
           layer, L, L * layer + head);
    free(r), free(tok);
}

int main(int argc, char **argv)
{
    bmt_error_t err;
    void *ws;
    ck(cudaSetDevice(0), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    ck(cudaMalloc(&ws, nn_cuda_workspace_bytes(4 * 1600)), "cudaMalloc");
    if ((h = nn_cuda_create(stream, ws, 4 * 1600, &err)) == NULL)
        die("nn_cuda_create", err.text);
    if (argc > 1 && strcmp(argv[1], "--ceiling") == 0) {
        ceiling();
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--profile") == 0) { /* for ncu: no checks, one timed run */
        if (argc > 2 && strcmp(argv[2], "d48") != 0 && strcmp(argv[2], "d12") != 0)
            die("--profile", "the shapes are d12 (the default) or d48");
        timed_runs = 1;
        bench(argc > 2 && strcmp(argv[2], "d48") == 0);
        nn_cuda_destroy(h);
        cudaFree(ws);
        return 0;
    }
    t_encoder(4, 64, 768, 1000);
    t_layernorm(512, 768);
    t_layernorm(300, 1600);
    t_layernorm(64, 100);   /* C % 8 != 0: the scalar kernels (the others take 16-byte chunks) */
    t_layernorm(4100, 768); /* the backward's row chunks: 9 rows each, the last one short */
    t_layernorm(200, 3072); /* two 16-byte units per thread */
    t_layernorm(16, 4160);  /* more than 512 units: the backward's two-pass kernels */
    t_matmul(256, 768, 2304, 0, 2304);    /* c_attn */
    t_matmul(256, 3072, 768, 0, 768);     /* mlp c_proj */
    t_matmul(100, 200, 136, 0, 136);      /* no dimension a multiple of 64 (split products) */
    t_matmul(128, 200, 128, 0, 128);      /* the bias gradient by the epilogue, n split */
    t_matmul(50, 64, 100, 0, 100);        /* OC % 8 != 0: the bias's scalar column sums */
    t_matmul_residual(256, 768, 768, 0);  /* attn c_proj */
    t_matmul_residual(256, 3072, 768, 0); /* mlp c_proj */
    t_matmul_residual(256, 2048, 576, 1); /* Llama's down_proj: W (OC,IC), no bias */
    t_matmul_residual(100, 200, 136, 0);  /* m, n and k split */
    t_matmul_gelu(256, 768, 3072);        /* c_fc and the MLP's projection, as GPT-2 runs them */
    t_matmul_gelu(100, 200, 136);         /* no dimension a multiple of 64 (split products) */
    t_matmul(128, 768, 1000, 1, 1024);    /* tied head, padded rows */
    t_matmul(16, 768, 50257, 1, 50304);
    /* The same with tuned plans: every candidate runs on scratch outputs, so
     * the products that add (dweight +=, dbias +=) must still add once. */
    if (nn_cuda_gemm_tune(h, NN_GEMM_TUNE_MAX + 1) != -1 || nn_cuda_gemm_tune(h, -1) != -1)
        die("nn_cuda_gemm_tune", "accepted a count outside [0, NN_GEMM_TUNE_MAX]");
    if (nn_cuda_gemm_tune(h, 8) != 0)
        die("nn_cuda_gemm_tune", "refused 8");
    check_tag = " (tuned products)";
    t_matmul(256, 768, 2304, 0, 2304);
    t_matmul_gelu(256, 768, 3072);
    t_matmul_gelu(100, 200, 136);
    t_matmul(16, 768, 50257, 1, 50304);
    nn_cuda_gemm_tune(h, 0);
    /* Where cuBLASLt has no algorithm: cuBLAS and the epilogue kernels. */
    nn_cuda_lt_off(h, 1);
    check_tag = " (cuBLAS, epilogues apart)";
    t_matmul(256, 768, 2304, 0, 2304);
    t_matmul(128, 200, 128, 0, 128);
    t_matmul_residual(256, 768, 768, 0);
    t_matmul_residual(100, 200, 136, 0);
    t_matmul_gelu(256, 768, 3072);
    t_matmul(16, 768, 50257, 1, 50304);
    nn_cuda_lt_off(h, 0);
    check_tag = "";
    t_attention(2, 128, 768, 12); /* GPT-2's head size 64: flash */
    t_attention(1, 200, 256, 4);  /* T not a multiple of the 128-row block */
    t_attention(1, 560, 256, 4);  /* a last block with one warpgroup's rows */
    printf("# attention forward kernel for head size 64 on this GPU: %s\n",
           nn_cuda_attention_kernel(h));
    nn_cuda_attention_mode(h, attn_mode_now = 2); /* the same with mma.sync kernels only */
    t_attention(2, 128, 768, 12);
    t_attention(1, 200, 256, 4);
    t_attention(1, 1024, 256, 4); /* many tiles: the two stages and the diagonal */
    nn_cuda_attention_mode(h, attn_mode_now = 0);
    t_attention(1, 1024, 256, 4);
    t_attention(2, 64, 64, 4);   /* head size 16 (the tiny model) */
    t_attention(1, 64, 128, 4);  /* head size 32 */
    t_attention(1, 96, 256, 2);  /* head size 128: the materialized path */
    t_attention(1, 100, 200, 4); /* head size 50: the materialized path */
    t_elementwise(1000003);      /* odd: the scalar kernels */
    t_elementwise(1 << 20);      /* the 16-byte kernels */
    t_crossentropy(200, 1000, 1024);
    t_crossentropy(16, 50257, 50304);
    t_crossentropy(1024, 128256, 128256); /* Llama 3's vocabulary; more rows than SMs */
    t_crossentropy(50, 1000, 1003);       /* rows not 16-byte aligned: the scalar kernel */
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        const int tune = argc > 2 ? atoi(argv[2]) : 0;
        const bool d48 = argc > 3 && strcmp(argv[3], "d48") == 0;
        if (argc > 3 && !d48 && strcmp(argv[3], "d12") != 0)
            die("--bench", "the shapes are d12 (the default) or d48");
        if (nn_cuda_gemm_tune(h, tune) != 0)
            die("--bench", "the tuning count must be in [0, NN_GEMM_TUNE_MAX]");
        printf("# products: %s\n",
               tune > 1 ? "the fastest of the tuned candidates" : "cuBLASLt's first heuristic");
        bench(d48);
    }
    nn_cuda_destroy(h);
    cudaFree(ws);
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
#endif
