/* tests/gpu/fp8_check.c — FP8 on CUDA (nn/fp8_cuda.h, nn_cuda_fp8_matmul of
 * nn/ops_cuda.h) against nn/fp8.h, the plain-C reference checked against the
 * formats' definitions (tests/integration/test_fp8.sh).
 *
 * Runs on a machine with a GPU (tests/gpu/test_fp8.sh). Prints TAP.
 *   - conversions, bit for bit: every bf16 bit pattern (256 x 256) at scale 1,
 *     so every FP8 value, every tie, the subnormals and the saturation are
 *     met, in E4M3 and E5M2, row-major and transposed (NaN inputs: a NaN code);
 *     the current-scaling pipeline (amax, scale, quantize) on random tensors
 *     of odd sizes; the amax (NaN when a NaN is in the tensor) and the scale
 *     and descale of a dozen amax values, and the flag a bad one sets;
 *     nn_cuda_fp8_cast against them, with a NaN in the tensor too; the paths
 *     of single elements (a misaligned start, a tail, rows ld apart);
 *   - products against nn_fp8_matmul on the same codes: E4M3 x E4M3 to bf16
 *     with fast accumulation, E5M2 x E4M3 to bf16 with a bias, E4M3 x E5M2 to
 *     f32 added into (beta 1). Bound per element, |gpu - ref| <= 2^-8 |ref| +
 *     c sum|a b| descale: the bf16 rounding of the output (2^-9) and the
 *     tensor cores' accumulation, c = 2^-10 with cuBLASLt's promotion to f32
 *     and 2^-9 with fast accumulation. Measured on an H200 (the largest c
 *     each check prints): 3.3e-5 to 4.1e-4 promoted, the largest with the
 *     widely spread gradients of the layer checks (the tensor cores align a
 *     chunk's products to its largest before they add, so small terms next
 *     to large ones lose bits), 2.1e-4 to 4.8e-4 fast;
 *   - FP8 against bf16 on random data: x (N,K) and W (OC,K) normal, each
 *     quantized with its current scale, the FP8 product against the bf16 one
 *     (nn_cuda_matmul_forward): ||fp8 - bf16|| / ||bf16|| <= 0.08 (E4M3: each
 *     operand rounded within 2^-4, about 0.036 RMS, so about 0.05 on the
 *     product of two; measured 0.0375), <= 0.15 with the gradient-like
 *     operand in E5M2 (measured 0.0589);
 *   - the FP8 linear layer (nn_cuda_fp8_conv1d_*) against its cpu emulation
 *     nn_fp8_linear_* on the same bf16 tensors, forward, dinp, dweight and
 *     dbias, the same bounds, the operands' records bit for bit (dinp from
 *     the weight's codes the forward kept the same bits as from the weight
 *     converted again), under
 *     current scaling and delayed (given scales, one saturating); a NaN
 *     input poisons every output and sets the flag (current), an inf makes
 *     NaN of what it enters and an inf record (delayed);
 *   - GELU made inside the forward's conversion and GELU's gradient inside
 *     the backward's (dgelu_pre) against the GELU kernels' outputs converted:
 *     the same bits (dbias, summed by the conversion, within 1e-6 of the
 *     column's sum of magnitudes where the single-element kernel sums it);
 *   - delayed scaling's step (nn_cuda_fp8_advance) against nn_fp8_plan_begin
 *     over 12 passes: scales bit for bit, the statistics;
 *   - the same bits on a second run; refusals named (E5M2 x E5M2, K not a
 *     multiple of 16, a misaligned pointer or descale, a bias with an f32
 *     output, a layer of 24 rows).
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
#include "nn/fp8.h"
#include "nn/fp8_cuda.h"
#include "nn/ops_cuda.h"

#include "gpu_check.h"

static const char *KN[2] = { "E4M3", "E5M2" };

static void ok(bool good, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ok(bool good, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%sok %d - ", good ? "" : "not ", ++tap_n);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    tap_failed += !good;
}

/* n values, normal(0, scale) times e^u, u uniform in [-spread, spread],
 * rounded to bf16. */
static float *rnd_spread(size_t n, float scale, double spread)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double u1 = uniform() + 1e-12, u2 = uniform();
        double g = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
        x[i] = bf16r((float)(g * scale * exp(spread * (2 * uniform() - 1))));
    }
    return x;
}

static float *dfloat(float v)
{
    float *d = dmalloc(sizeof(float));
    h2d(d, &v, sizeof(float));
    return d;
}

/* n device floats, 0. */
static float *zeros_dev(size_t n)
{
    float *d = dmalloc(n * sizeof(float));
    ck(cudaMemsetAsync(d, 0, n * sizeof(float), stream), "memset");
    return d;
}

static float get(const float *d)
{
    float v;
    d2h(&v, d, sizeof(v));
    return v;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof(a)) == 0; }

/* q (rows,cols) from the device, against the reference of x at scale: bit for
 * bit, a NaN input needing only a NaN code; qt against q's transpose. */
static void check_codes(const char *what, nn_fp8_kind_t k, const float *x, int rows, int cols,
                        float scale, const uint8_t *dq, const uint8_t *dqt)
{
    const size_t n = (size_t)rows * cols;
    uint8_t *want = xmalloc(n), *q = xmalloc(n), *qt = xmalloc(n);
    nn_fp8_quantize(want, x, n, scale, k, NULL);
    d2h(q, dq, n);
    size_t bad = 0, first = n, tbad = 0;
    for (size_t i = 0; i < n; i++) {
        bool good = isnan(x[i]) ? isnan(nn_fp8_to_f32(q[i], k)) : q[i] == want[i];
        if (!good && bad++ == 0)
            first = i;
    }
    if (dqt) {
        d2h(qt, dqt, n);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                tbad += qt[(size_t)c * rows + r] != q[(size_t)r * cols + c];
    }
    ok(bad == 0 && tbad == 0, "%s %s: %zu codes bit for bit%s", what, KN[k], n,
       dqt ? ", and the transposed copy" : "");
    if (bad)
        printf("#   %zu differ; first x = %a: got %#04x, want %#04x\n", bad, x[first], q[first],
               want[first]);
    if (tbad)
        printf("#   %zu transposed codes differ\n", tbad);
    free(want), free(q), free(qt);
}

/* Every bf16 pattern as a 256 x 256 tensor at scale 1. */
static void t_all_bf16(void)
{
    const int rows = 256, cols = 256;
    const size_t n = (size_t)rows * cols;
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = bmt_bf16_to_f32((uint16_t)i);
    void *dx = up_bf16(x, n);
    uint8_t *dq = dmalloc(n), *dqt = dmalloc(n);
    float *one = dfloat(1.0f), *amax = dfloat(0.0f);
    bmt_error_t err;
    for (int k = 0; k < 2; k++) {
        run(nn_cuda_fp8_quantize(h, dq, dqt, dx, cols, rows, cols, one, (nn_fp8_kind_t)k, amax,
                                 &err),
            "quantize", &err);
        check_codes("every bf16 pattern at scale 1:", (nn_fp8_kind_t)k, x, rows, cols, 1.0f, dq,
                    dqt);
        ok(isnan(get(amax)), "every bf16 pattern %s: amax is NaN (NaNs among them)", KN[k]);
    }
    /* The finite ones: amax, then scale and descale from the device, then the
     * codes at that scale (most of the small ones underflow: that is the
     * point of a scale from the largest). */
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            x[i] = 0.0f;
    cudaFree(dx);
    dx = up_bf16(x, n);
    float *scale = dfloat(0), *descale = dfloat(0);
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    for (int k = 0; k < 2; k++) {
        run(nn_cuda_fp8_amax(h, amax, dx, n, &err), "amax", &err);
        float want = nn_fp8_amax(x, n), got = get(amax);
        ok(same_bits(got, want), "finite bf16 patterns %s: amax %g bit for bit", KN[k], want);
        run(nn_cuda_fp8_scale(h, scale, descale, amax, (nn_fp8_kind_t)k, 0, bad, &err), "scale",
            &err);
        float s = nn_fp8_scale(want, (nn_fp8_kind_t)k, 0), gs = get(scale), gd = get(descale);
        ok(same_bits(gs, s) && same_bits(gd, 1.0f / s), "%s: scale %g and descale bit for bit",
           KN[k], s);
        run(nn_cuda_fp8_quantize(h, dq, NULL, dx, cols, rows, cols, scale, (nn_fp8_kind_t)k, NULL,
                                 &err),
            "quantize", &err);
        check_codes("finite bf16 patterns at their current scale:", (nn_fp8_kind_t)k, x, rows, cols,
                    s, dq, NULL);
    }
    int b;
    d2h(&b, bad, sizeof(b));
    ok(b == 0, "no scale failed, no flag set");
    cudaFree(dx), cudaFree(dq), cudaFree(dqt), cudaFree(one), cudaFree(amax), cudaFree(scale),
        cudaFree(descale), cudaFree(bad);
    free(x);
}

/* nn_cuda_fp8_scale of amax values on the edges, margins 0 and 3. */
static void t_scales(void)
{
    const float am[] = { 1.0f,  448.0f, 57344.0f, 3e-36f,   1e-38f, 1e-45f,
                         3e38f, 0.0f,   -1.0f,    INFINITY, NAN,    7.25e-3f };
    const int na = sizeof(am) / sizeof(am[0]);
    float *amax = dfloat(0), *scale = dfloat(0), *descale = dfloat(0);
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    bmt_error_t err;
    for (int k = 0; k < 2; k++)
        for (int margin = 0; margin <= 3; margin += 3) {
            int wrong = 0, flags = 0, want_flags = 0;
            for (int i = 0; i < na; i++) {
                h2d(amax, &am[i], sizeof(float));
                ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
                run(nn_cuda_fp8_scale(h, scale, descale, amax, (nn_fp8_kind_t)k, margin, bad, &err),
                    "scale", &err);
                float s = nn_fp8_scale(am[i], (nn_fp8_kind_t)k, margin);
                float d = s == 0.0f ? NAN : 1.0f / s;
                int b;
                d2h(&b, bad, sizeof(b));
                const float gs = get(scale), gd = get(descale);
                wrong +=
                    s == 0.0f ? !(isnan(gs) && isnan(gd)) : !same_bits(gs, s) || !same_bits(gd, d);
                flags += b;
                want_flags += s == 0.0f;
            }
            ok(wrong == 0 && flags == want_flags,
               "%s margin %d: scale and descale of %d amax values (0, tiny, NaN, inf, negative) "
               "bit for bit; the %d that cannot be scaled get NaN and set the flag",
               KN[k], margin, na, want_flags);
        }
    cudaFree(amax), cudaFree(scale), cudaFree(descale), cudaFree(bad);
}

/* Current scaling of a random tensor: amax, scale, both layouts. */
static void t_pipeline(int rows, int cols, int margin)
{
    const size_t n = (size_t)rows * cols;
    float *x = rnd_spread(n, 1.0f, 4.0);
    void *dx = up_bf16(x, n);
    uint8_t *dq = dmalloc(n), *dqt = dmalloc(n);
    float *amax = dfloat(0), *scale = dfloat(0), *descale = dfloat(0), *amax2 = dfloat(0);
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    bmt_error_t err;
    char what[96];
    for (int k = 0; k < 2; k++) {
        run(nn_cuda_fp8_amax(h, amax, dx, n, &err), "amax", &err);
        run(nn_cuda_fp8_scale(h, scale, descale, amax, (nn_fp8_kind_t)k, margin, bad, &err),
            "scale", &err);
        run(nn_cuda_fp8_quantize(h, dq, dqt, dx, cols, rows, cols, scale, (nn_fp8_kind_t)k, amax2,
                                 &err),
            "quantize", &err);
        float s = nn_fp8_scale(nn_fp8_amax(x, n), (nn_fp8_kind_t)k, margin);
        snprintf(what, sizeof(what), "random %d x %d, margin %d:", rows, cols, margin);
        check_codes(what, (nn_fp8_kind_t)k, x, rows, cols, s, dq, dqt);
        ok(same_bits(get(amax), get(amax2)) && same_bits(get(scale), s),
           "%s %s: the conversion's amax equals nn_cuda_fp8_amax's; the scale is the host's", what,
           KN[k]);
    }
    cudaFree(dx), cudaFree(dq), cudaFree(dqt), cudaFree(amax), cudaFree(scale), cudaFree(descale),
        cudaFree(amax2), cudaFree(bad);
    free(x);
}

/* nn_cuda_fp8_cast (amax, then the conversion making the scale itself)
 * against the three calls, and the paths the 16-byte kernels leave to single
 * elements: x misaligned, n not a multiple of 8 (amax), rows ld apart with ld
 * or cols not a multiple of 8 (quantize). Every result bit for bit against
 * the host. */
static void t_cast_and_edges(int rows, int cols)
{
    const size_t n = (size_t)rows * cols;
    float *x = rnd_spread(n, 3.0f, 4.0);
    void *dx = up_bf16(x, n);
    uint8_t *dq = dmalloc(n), *dqt = dmalloc(n);
    float *s = dmalloc(4 * sizeof(float));
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    bmt_error_t err;
    for (int k = 0; k < 2; k++) {
        run(nn_cuda_fp8_cast(h, dq, dqt, dx, rows, cols, (nn_fp8_kind_t)k, s, bad, &err), "cast",
            &err);
        const float a = nn_fp8_amax(x, n), sc = nn_fp8_scale(a, (nn_fp8_kind_t)k, 0);
        float got[3];
        d2h(got, s, sizeof(got));
        ok(same_bits(got[2], a) && same_bits(got[1], sc) && same_bits(got[0], 1.0f / sc),
           "cast %d x %d %s: amax, scale and descale bit for bit", rows, cols, KN[k]);
        char what[64];
        snprintf(what, sizeof what, "cast %d x %d:", rows, cols);
        check_codes(what, (nn_fp8_kind_t)k, x, rows, cols, sc, dq, dqt);
    }
    /* a NaN in it: NaN scale and descale, every code NaN, the flag set */
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    y[n / 2 + 3] = NAN;
    void *dy = up_bf16(y, n);
    run(nn_cuda_fp8_cast(h, dq, NULL, dy, rows, cols, NN_FP8_E4M3, s, bad, &err), "cast", &err);
    float got[3];
    int b;
    d2h(got, s, sizeof(got));
    d2h(&b, bad, sizeof(b));
    uint8_t *q = xmalloc(n);
    d2h(q, dq, n);
    size_t nan_codes = 0;
    for (size_t i = 0; i < n; i++)
        nan_codes += isnan(nn_fp8_to_f32(q[i], NN_FP8_E4M3));
    ok(isnan(got[0]) && isnan(got[1]) && isnan(got[2]) && b == 1 && nan_codes == n,
       "cast of a tensor with a NaN: amax, scale, descale NaN, %zu of %zu codes NaN, flag %d",
       nan_codes, n, b);
    /* amax over n - 5 values (16-byte chunks, then a tail of single ones), and
     * from a misaligned start (single ones throughout) */
    float *am = dfloat(0);
    for (int off = 0; off <= 3; off += 3) {
        run(nn_cuda_fp8_amax(h, am, (const uint16_t *)dx + off, n - 5 - off, &err), "amax", &err);
        ok(same_bits(get(am), nn_fp8_amax(x + off, n - 5 - off)),
           "amax of %zu values from element %d: bit for bit", n - 5 - off, off);
    }
    /* rows ld apart: ld = cols + 8 (16-byte chunks) and ld = cols + 3 (single) */
    for (int pad = 8; pad >= 3; pad -= 5) {
        const int ld = cols + pad;
        float *w = xmalloc((size_t)rows * ld * sizeof(float));
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < ld; c++)
                w[(size_t)r * ld + c] = c < cols ? x[(size_t)r * cols + c] : 1e30f;
        void *dw = up_bf16(w, (size_t)rows * ld);
        float *one = dfloat(0.5f);
        for (int k = 0; k < 2; k++) {
            run(nn_cuda_fp8_quantize(h, dq, dqt, dw, ld, rows, cols, one, (nn_fp8_kind_t)k, am,
                                     &err),
                "quantize", &err);
            char what[64];
            snprintf(what, sizeof what, "rows %d apart (%s):", ld,
                     pad == 8 ? "16-byte chunks" : "single elements");
            check_codes(what, (nn_fp8_kind_t)k, x, rows, cols, 0.5f, dq, dqt);
            ok(same_bits(get(am), nn_fp8_amax(x, n)),
               "%s %s: the conversion's amax leaves the padding out", what, KN[k]);
        }
        cudaFree(dw), cudaFree(one);
        free(w);
    }
    cudaFree(dx), cudaFree(dy), cudaFree(dq), cudaFree(dqt), cudaFree(s), cudaFree(bad),
        cudaFree(am);
    free(x), free(y), free(q);
}

/* Random finite codes of kind k, the values spread as a scaled tensor's. */
static uint8_t *codes(size_t n, nn_fp8_kind_t k)
{
    float *x = rnd_spread(n, nn_fp8_max(k) / 8, 2.0);
    uint8_t *q = xmalloc(n);
    nn_fp8_quantize(q, x, n, 1.0f, k, NULL);
    free(x);
    return q;
}

static void t_matmul(const char *what, nn_fp8_kind_t ka, nn_fp8_kind_t kb, int out_f32, int bias,
                     float beta, int fast, int N, int K, int OC)
{
    const size_t na = (size_t)N * K, nb = (size_t)OC * K, no = (size_t)N * OC;
    uint8_t *a = codes(na, ka), *b = codes(nb, kb);
    const float ad = 1.0f / 37.5f, bd = 1.0f / 3.25f;
    float *want = xmalloc(no * sizeof(float)), *got = xmalloc(no * sizeof(float));
    float *sabs = xmalloc(no * sizeof(float)), *prior = rnd_spread(no, 1.0f, 0.0);
    float *bv = bias ? rnd_spread(OC, 1.0f, 0.0) : NULL;
    nn_fp8_matmul(want, a, ka, b, kb, (float)((double)ad * bd), N, K, OC);
    /* sum |a b| descale, the accumulation bound's scale */
    uint8_t *aa = xmalloc(na), *ba = xmalloc(nb);
    for (size_t i = 0; i < na; i++)
        aa[i] = a[i] & 0x7f;
    for (size_t i = 0; i < nb; i++)
        ba[i] = b[i] & 0x7f;
    nn_fp8_matmul(sabs, aa, ka, ba, kb, (float)((double)ad * bd), N, K, OC);
    for (size_t i = 0; i < no; i++) {
        if (bias)
            want[i] += bv[i % OC];
        if (beta != 0.0f)
            want[i] += beta * prior[i];
    }
    uint8_t *da = dmalloc(na), *db = dmalloc(nb);
    h2d(da, a, na);
    h2d(db, b, nb);
    float *dad = dfloat(ad), *dbd = dfloat(bd);
    void *dbias = bias ? up_bf16(bv, OC) : NULL;
    void *dout = dmalloc(no * (out_f32 ? 4 : 2));
    bmt_error_t err;
    uint8_t *first = xmalloc(no * 4);
    for (int pass = 0; pass < 2; pass++) {
        if (out_f32)
            h2d(dout, prior, no * 4);
        run(nn_cuda_fp8_matmul(h, dout, out_f32, OC, da, ka, dad, db, kb, dbd, dbias, beta, fast, N,
                               K, OC, &err),
            what, &err);
        if (out_f32) {
            d2h(got, dout, no * 4);
        } else {
            uint16_t *t = xmalloc(no * 2);
            d2h(t, dout, no * 2);
            for (size_t i = 0; i < no; i++)
                got[i] = bmt_bf16_to_f32(t[i]);
            free(t);
        }
        if (pass == 0)
            memcpy(first, got, no * 4);
    }
    const double c = fast ? 0x1p-9 : 0x1p-10;
    double worst = 0, cmax = 0;
    size_t bad = 0;
    for (size_t i = 0; i < no; i++) {
        double e = fabs((double)got[i] - want[i]);
        double bound = 0x1p-8 * fabs(want[i]) + c * sabs[i];
        if (!(e <= bound))
            bad++;
        worst = fmax(worst, e / bound);
        if (sabs[i] > 0)
            cmax = fmax(cmax, fmax(0, e - 0x1p-8 * fabs(want[i])) / sabs[i]);
    }
    ok(bad == 0, "%s (%s x %s, %d x %d x %d): within 2^-8 |ref| + %s sum|ab| descale", what, KN[ka],
       KN[kb], N, K, OC, fast ? "2^-9" : "2^-10");
    printf("#   largest error / bound %.3g; largest c measured %.3g\n", worst, cmax);
    ok(memcmp(first, got, no * 4) == 0, "%s: the same bits on a second run", what);
    cudaFree(da), cudaFree(db), cudaFree(dad), cudaFree(dbd), cudaFree(dout);
    if (dbias)
        cudaFree(dbias);
    free(a), free(b), free(want), free(got), free(sabs), free(prior), free(bv), free(aa), free(ba),
        free(first);
}

/* FP8 against bf16 on random data: x (N,K), W (OC,K) normal; the FP8 side
 * quantizes each with its current scale (x in kx, W in E4M3). */
static void t_vs_bf16(nn_fp8_kind_t kx, int N, int K, int OC, double bound)
{
    float *x = rnd_spread((size_t)N * K, 1.0f, 0.0), *w = rnd_spread((size_t)OC * K, 0.02f, 0.0);
    void *dx = up_bf16(x, (size_t)N * K), *dw = up_bf16(w, (size_t)OC * K);
    void *ref = dmalloc((size_t)N * OC * 2), *out = dmalloc((size_t)N * OC * 2);
    uint8_t *qx = dmalloc((size_t)N * K), *qw = dmalloc((size_t)OC * K);
    float *am = dfloat(0), *sx = dfloat(0), *dsx = dfloat(0), *sw = dfloat(0), *dsw = dfloat(0);
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    bmt_error_t err;
    run(nn_cuda_matmul_forward(h, ref, OC, dx, dw, NULL, N, K, OC, 1, &err), "bf16 matmul", &err);
    run(nn_cuda_fp8_amax(h, am, dx, (size_t)N * K, &err), "amax", &err);
    run(nn_cuda_fp8_scale(h, sx, dsx, am, kx, 0, bad, &err), "scale", &err);
    run(nn_cuda_fp8_quantize(h, qx, NULL, dx, K, N, K, sx, kx, NULL, &err), "quantize", &err);
    run(nn_cuda_fp8_amax(h, am, dw, (size_t)OC * K, &err), "amax", &err);
    run(nn_cuda_fp8_scale(h, sw, dsw, am, NN_FP8_E4M3, 0, bad, &err), "scale", &err);
    run(nn_cuda_fp8_quantize(h, qw, NULL, dw, K, OC, K, sw, NN_FP8_E4M3, NULL, &err), "quantize",
        &err);
    run(nn_cuda_fp8_matmul(h, out, 0, OC, qx, kx, dsx, qw, NN_FP8_E4M3, dsw, NULL, 0.0f, 1, N, K,
                           OC, &err),
        "fp8 matmul", &err);
    const size_t no = (size_t)N * OC;
    uint16_t *a = xmalloc(no * 2), *b = xmalloc(no * 2);
    d2h(a, out, no * 2);
    d2h(b, ref, no * 2);
    double num = 0, den = 0;
    for (size_t i = 0; i < no; i++) {
        double g = bmt_bf16_to_f32(a[i]), r = bmt_bf16_to_f32(b[i]);
        num += (g - r) * (g - r);
        den += r * r;
    }
    double e = sqrt(num / den);
    ok(e <= bound,
       "FP8 (x %s, W E4M3, current scaling) against bf16 on random %d x %d x %d: "
       "rel err %.3g (bound %.3g)",
       KN[kx], N, K, OC, e, bound);
    cudaFree(dx), cudaFree(dw), cudaFree(ref), cudaFree(out), cudaFree(qx), cudaFree(qw),
        cudaFree(am), cudaFree(sx), cudaFree(dsx), cudaFree(sw), cudaFree(dsw), cudaFree(bad);
    free(x), free(w), free(a), free(b);
}

/* |e| <= 2^-8 |ref| + c sabs per element; prints the largest c measured. */
static void within(const char *what, const float *got, const float *want, const float *sabs,
                   size_t n, double c)
{
    double worst = 0, cmax = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]), bound = 0x1p-8 * fabs(want[i]) + c * sabs[i];
        bad += !(e <= bound);
        worst = fmax(worst, e / bound);
        if (sabs[i] > 0)
            cmax = fmax(cmax, fmax(0, e - 0x1p-8 * fabs(want[i])) / sabs[i]);
    }
    ok(bad == 0, "%s: within 2^-8 |ref| + %s sum|ab| descale (%zu values)", what,
       c > 0x1p-10 ? "2^-9" : "2^-10", n);
    printf("#   largest error / bound %.3g; largest c measured %.3g\n", worst, cmax);
}

static float *absf(const float *x, size_t n)
{
    float *a = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        a[i] = fabsf(x[i]);
    return a;
}

/* Layer forward and backward of either weight layout: wt 0, HF's Conv1D
 * (nn_cuda_fp8_conv1d_*, no GELU), wt 1, nn.Linear (nn_cuda_fp8_linear_*). */
static int layer_fwd(int wt, void *out, uint8_t *xqt, uint8_t *wk, const void *x, const void *w,
                     const void *b, int N, int IC, int OC, const nn_cuda_fp8_scales_t *sc,
                     void *scratch, bmt_error_t *err)
{
    return wt ? nn_cuda_fp8_linear_forward(h, out, xqt, wk, x, w, b, N, IC, OC, 1, sc, scratch, err)
              : nn_cuda_fp8_conv1d_forward(h, out, xqt, wk, x, 0, w, b, N, IC, OC, 1, sc, scratch,
                                           err);
}

static int layer_bwd(int wt, void *dinp, float *dw, float *db, const void *dout, const uint8_t *xqt,
                     const uint8_t *wk, const void *w, int N, int IC, int OC,
                     const nn_cuda_fp8_scales_t *sc, void *scratch, int add, bmt_error_t *err)
{
    return wt ? nn_cuda_fp8_linear_backward(h, dinp, dw, db, dout, xqt, wk, w, N, IC, OC, sc,
                                            scratch, add, err)
              : nn_cuda_fp8_conv1d_backward(h, dinp, dw, db, dout, NULL, xqt, wk, w, N, IC, OC, sc,
                                            scratch, add, err);
}

/* out = res + the layer's product in one FP8 product (the residual as C):
 * against the emulation's product plus res (one rounding more on the
 * reference side: within the forward's bound); no res, or res == out,
 * refused. out/sout: the emulation's product and its magnitudes; g_out: the
 * plain forward's output (not a reference: it shows res changed the sums). */
static void t_layer_residual(int wt, const char *lay, const char *how, const float *g_out,
                             const float *out, const float *sout, const void *gx, const void *gw,
                             const void *gb, int N, int IC, int OC, const nn_cuda_fp8_scales_t *gsc,
                             void *scratch)
{
    const size_t no = (size_t)N * OC;
    float *res = rnd_spread(no, 1.0f, 2.0), *want = xmalloc(no * 4);
    for (size_t i = 0; i < no; i++)
        want[i] = (float)((double)out[i] + res[i]);
    void *gres = up_bf16(res, no), *gy = dmalloc(no * 2);
    bmt_error_t err;
    char what[200];
    run(wt ? nn_cuda_fp8_linear_residual_forward(h, gy, gres, NULL, NULL, gx, gw, gb, N, IC, OC, 1,
                                                 gsc, scratch, &err)
           : nn_cuda_fp8_conv1d_residual_forward(h, gy, gres, NULL, NULL, gx, 0, gw, gb, N, IC, OC,
                                                 1, gsc, scratch, &err),
        "fp8 residual forward", &err);
    float *g_y = down_bf16(gy, no);
    snprintf(what, sizeof what,
             "%s %d x %d -> %d, %s: res + the product in one FP8 product (res as C), against the "
             "emulation + res",
             lay, N, IC, OC, how);
    within(what, g_y, want, sout, no, 0x1p-9);
    size_t moved = 0;
    for (size_t i = 0; i < no; i++)
        moved += g_y[i] != g_out[i];
    ok(moved > no / 2, "%s %d x %d -> %d, %s: res changed %zu of %zu values of the plain product",
       lay, N, IC, OC, how, moved, no);
    /* refused: without res, and in place (cuBLASLt's FP8 product gave other
     * bits in place than into a buffer of its own); nothing written */
    bmt_error_t e2;
    uint16_t *before = xmalloc(no * 2), *after = xmalloc(no * 2);
    d2h(before, gy, no * 2);
    const int rc = wt ? nn_cuda_fp8_linear_residual_forward(h, gy, NULL, NULL, NULL, gx, gw, gb, N,
                                                            IC, OC, 1, gsc, scratch, &e2)
                      : nn_cuda_fp8_conv1d_residual_forward(h, gy, NULL, NULL, NULL, gx, 0, gw, gb,
                                                            N, IC, OC, 1, gsc, scratch, &e2);
    ok(rc < 0 && strstr(e2.text, "res is NULL") != NULL,
       "%s: the residual forward without res: refused (%s)", lay, rc < 0 ? e2.text : "accepted");
    const int rc2 = wt ? nn_cuda_fp8_linear_residual_forward(h, gy, gy, NULL, NULL, gx, gw, gb, N,
                                                             IC, OC, 1, gsc, scratch, &e2)
                       : nn_cuda_fp8_conv1d_residual_forward(h, gy, gy, NULL, NULL, gx, 0, gw, gb,
                                                             N, IC, OC, 1, gsc, scratch, &e2);
    ck(cudaStreamSynchronize(stream), "sync");
    d2h(after, gy, no * 2);
    ok(rc2 < 0 && strstr(e2.text, "res is out") != NULL && memcmp(before, after, no * 2) == 0,
       "%s: the residual forward in place (res == out): refused, out untouched (%s)", lay,
       rc2 < 0 ? e2.text : "accepted");
    free(before), free(after);
    free(res), free(want), free(g_y);
    cudaFree(gres), cudaFree(gy);
}

/* The FP8 linear layer (nn_cuda_fp8_conv1d_* for wt 0, HF's Conv1D weight
 * (IC,OC); nn_cuda_fp8_linear_* for wt 1, nn.Linear's (OC,IC)) against its
 * f32 emulation nn_fp8_linear_* (nn/fp8.h) with the same wt on the same bf16
 * tensors: the codes are the
 * same (same values, same scales), so the results differ only by the
 * accumulation and the bf16 rounding of the outputs. dinp and dweight (added
 * into a prior) from one backward call, dbias (from the unrounded gradient,
 * f32 sums), the records of the three operands bit for bit. Current scaling,
 * or delayed at given scales: the input's at half its amax (its largest
 * values saturate), the weight's at twice, the gradient's at its own. */
static void t_layer(int N, int IC, int OC, int delayed, int wt)
{
    const char *lay = wt ? "linear" : "conv1d";
    const size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
    float *x = rnd_spread(nx, 1.0f, 1.5), *w = rnd_spread(nw, 0.02f, 1.0),
          *b = rnd_spread(OC, 0.1f, 0.0), *dout = rnd_spread(no, 1e-3f, 3.0),
          *prior = rnd_spread(nw, 1e-2f, 0.0);
    float *ax = absf(x, nx), *aw = absf(w, nw), *ad = absf(dout, no);
    const char *how = delayed ? "delayed" : "current";
    nn_fp8_scaling_t sc = { 0 }, ssc;
    if (delayed) {
        sc.delayed = 1;
        sc.scale[0] = nn_fp8_scale(nn_fp8_amax(x, nx) * 0.5f, NN_FP8_E4M3, 0);
        sc.scale[1] = nn_fp8_scale(nn_fp8_amax(w, nw) * 2.0f, NN_FP8_E4M3, 0);
        sc.scale[2] = nn_fp8_scale(nn_fp8_amax(dout, no), NN_FP8_E5M2, 0);
    }
    ssc = sc;
    /* references: the emulation, and the same on magnitudes for the bound's sums */
    float *out = xmalloc(no * 4), *sout = xmalloc(no * 4);
    float *dinp = zeros(nx), *sdinp = zeros(nx), *dw = copy(prior, nw), *sdw = zeros(nw),
          *db = zeros(OC);
    nn_fp8_linear_forward(&sc, out, x, w, b, N, IC, OC, wt);
    nn_fp8_linear_forward(&ssc, sout, ax, aw, NULL, N, IC, OC, wt);
    float *gdb = up_f32(db, OC);
    nn_fp8_linear_backward(&sc, dinp, dw, db, dout, x, w, N, IC, OC, wt);
    nn_fp8_linear_backward(&ssc, sdinp, sdw, NULL, ad, ax, aw, N, IC, OC, wt);
    void *gx = up_bf16(x, nx), *gw = up_bf16(w, nw), *gb = up_bf16(b, OC),
         *gdout = up_bf16(dout, no), *gout = dmalloc(no * 2), *gdinp = dmalloc(nx * 2);
    float *gdw = up_f32(prior, nw);
    float hs[NN_FP8_CONV1D_SCALES] = { 0 };
    for (int j = 0; j < 3 && delayed; j++)
        hs[4 * j + 1] = sc.scale[j], hs[4 * j] = 1.0f / sc.scale[j];
    float *s = dmalloc(NN_FP8_CONV1D_SCALES * sizeof(float)), *rec = zeros_dev(3);
    h2d(s, hs, sizeof hs);
    uint8_t *xqt = dmalloc(nx), *gwq = dmalloc(nw);
    void *scratch = dmalloc(nn_cuda_fp8_conv1d_scratch_bytes(N, IC, OC));
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    const nn_cuda_fp8_scales_t gsc = { s, rec, delayed, bad };
    bmt_error_t err;
    char what[160];
    run(layer_fwd(wt, gout, xqt, gwq, gx, gw, gb, N, IC, OC, &gsc, scratch, &err), lay, &err);
    run(layer_bwd(wt, gdinp, gdw, gdb, gdout, xqt, gwq, gw, N, IC, OC, &gsc, scratch, 1, &err), lay,
        &err);
    float *g_out = down_bf16(gout, no), *g_dinp = down_bf16(gdinp, nx), *g_dw = down_f32(gdw, nw),
          *g_db = down_f32(gdb, OC), *g_rec = down_f32(rec, 3);
    /* add 0 (fresh gradients): dweight and dbias written into NaN-filled
     * buffers (dmalloc's poison); the record is restored after (a second
     * conversion of the same gradient max's the same amax into it) */
    float *gdw0 = dmalloc(nw * 4), *gdb0 = dmalloc((size_t)OC * 4);
    run(layer_bwd(wt, NULL, gdw0, gdb0, gdout, xqt, NULL, gw, N, IC, OC, &gsc, scratch, 0, &err),
        "backward (add 0)", &err);
    float *g_dw0 = down_f32(gdw0, nw), *g_db0 = down_f32(gdb0, OC), *dw0 = xmalloc(nw * 4);
    for (size_t i = 0; i < nw; i++)
        dw0[i] = dw[i] - prior[i];
    snprintf(what, sizeof what, "%s %d x %d -> %d, %s: dweight written (add 0) into NaN", lay, N,
             IC, OC, how);
    within(what, g_dw0, dw0, sdw, nw, 0x1p-10);
    ok(memcmp(g_db0, g_db, (size_t)OC * 4) == 0,
       "%s %d x %d -> %d, %s: dbias written (add 0) into NaN: the bits added into zeros", lay, N,
       IC, OC, how);
    h2d(rec, g_rec, 12);
    free(g_dw0), free(g_db0), free(dw0);
    cudaFree(gdw0), cudaFree(gdb0);
    /* dinp again from the weight itself, not the codes the forward kept */
    run(layer_bwd(wt, gdinp, NULL, NULL, gdout, NULL, NULL, gw, N, IC, OC, &gsc, scratch, 1, &err),
        "backward, the weight converted again", &err);
    float *g_dinp2 = down_bf16(gdinp, nx);
    ok(memcmp(g_dinp, g_dinp2, nx * sizeof(float)) == 0,
       "%s %d x %d -> %d, %s: dinp from the weight's codes the forward kept, the same bits as "
       "from the weight converted again",
       lay, N, IC, OC, how);
    free(g_dinp2);
    snprintf(what, sizeof what,
             "%s %d x %d -> %d, %s scaling, against nn_fp8_linear_*: forward (fast)", lay, N, IC,
             OC, how);
    within(what, g_out, out, sout, no, 0x1p-9);
    t_layer_residual(wt, lay, how, g_out, out, sout, gx, gw, gb, N, IC, OC, &gsc, scratch);
    snprintf(what, sizeof what, "%s %d x %d -> %d, %s: dinp", lay, N, IC, OC, how);
    within(what, g_dinp, dinp, sdinp, nx, 0x1p-10);
    snprintf(what, sizeof what, "%s %d x %d -> %d, %s: dweight added into a prior", lay, N, IC, OC,
             how);
    within(what, g_dw, dw, sdw, nw, 0x1p-10);
    double dbe = 0;
    for (int o = 0; o < OC; o++) {
        double sa = 0;
        for (int i = 0; i < N; i++)
            sa += ad[(size_t)i * OC + o];
        dbe = fmax(dbe, fabs((double)g_db[o] - db[o]) / (sa + 1e-30));
    }
    ok(dbe <= 1e-5,
       "%s %d x %d -> %d, %s: dbias from the unrounded gradient: within 1e-5 sum|dout| (%.3g)", lay,
       N, IC, OC, how, dbe);
    ok(same_bits(g_rec[0], sc.amax[0]) && same_bits(g_rec[1], sc.amax[1]) &&
           same_bits(g_rec[2], sc.amax[2]),
       "%s %d x %d -> %d, %s: the records (input, weight, gradient) equal the emulation's: "
       "%g %g %g",
       lay, N, IC, OC, how, g_rec[0], g_rec[1], g_rec[2]);
    if (delayed) { /* the input's largest values saturated: the scale was set so */
        size_t sat = 0;
        uint8_t *q = xmalloc(nx);
        nn_fp8_quantize(q, x, nx, sc.scale[0], NN_FP8_E4M3, &sat);
        ok(sat > 0 && g_rec[0] * sc.scale[0] > 448.0f,
           "%s, delayed: the input at half its amax's scale saturated %zu values, and its "
           "record says so",
           lay, sat);
        free(q);
    }
    /* a NaN (current) or an inf (delayed) in the input: under current scaling
     * every output NaN and the flag set; delayed, NaN where it enters (its
     * row of out), as the emulation, and the record inf */
    int flag = 0;
    d2h(&flag, bad, sizeof(int));
    ok(flag == 0, "%s %d x %d -> %d, %s: no operand flagged", lay, N, IC, OC, how);
    const size_t at = (size_t)(N / 2) * IC + 3;
    x[at] = delayed ? INFINITY : NAN;
    put_bf16(gx, x, nx);
    nn_fp8_linear_forward(&sc, out, x, w, b, N, IC, OC, wt);
    run(layer_fwd(wt, gout, xqt, NULL, gx, gw, gb, N, IC, OC, &gsc, scratch, &err), lay, &err);
    float *nan_out = down_bf16(gout, no);
    size_t finite = 0, differ = 0, cpu_nan = 0;
    for (size_t i = 0; i < no; i++) {
        finite += isfinite(nan_out[i]) != 0;
        cpu_nan += isnan(out[i]) != 0;
        differ += (isnan(nan_out[i]) != 0) != (isnan(out[i]) != 0);
    }
    d2h(&flag, bad, sizeof(int));
    free(g_rec);
    g_rec = down_f32(rec, 3);
    if (!delayed)
        ok(finite == 0 && flag == 1,
           "%s %d x %d -> %d, current: one NaN in the input makes every output NaN (%zu "
           "finite) and sets the flag",
           lay, N, IC, OC, finite);
    else
        ok(differ == 0 && cpu_nan == (size_t)OC && isinf(g_rec[0]) && flag == 0,
           "%s %d x %d -> %d, delayed: an inf in the input makes NaN of its row of out (%zu, "
           "as the emulation), its record inf (%g), no flag (%d)",
           lay, N, IC, OC, no - finite, g_rec[0], flag);
    cudaFree(gx), cudaFree(gw), cudaFree(gb), cudaFree(gdout), cudaFree(gout), cudaFree(gdinp),
        cudaFree(gdw), cudaFree(gdb), cudaFree(s), cudaFree(rec), cudaFree(xqt), cudaFree(gwq),
        cudaFree(scratch), cudaFree(bad);
    free(x), free(w), free(b), free(dout), free(prior), free(ax), free(aw), free(ad), free(out),
        free(sout), free(dinp), free(sdinp), free(dw), free(sdw), free(db), free(g_out),
        free(g_dinp), free(g_dw), free(g_db), free(nan_out), free(g_rec);
}

/* GELU made inside the conversion (nn_cuda_fp8_conv1d_forward's and
 * nn_cuda_fp8_codes' gelu) against nn_cuda_gelu_forward's output converted:
 * the same codes, scales, records and product, bit for bit, under current
 * and delayed scaling; and on a shape and offset that take the
 * single-element kernels (amax and conversion). */
static void t_gelu(int N, int IC, int OC, int delayed)
{
    const size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
    const char *how = delayed ? "delayed" : "current";
    float *x = rnd_spread(nx, 1.5f, 1.0), *w = rnd_spread(nw, 0.02f, 1.0);
    x[7] = -INFINITY, x[8] = 30.0f, x[9] = -30.0f; /* GELU(-inf) is NaN: delayed records it */
    if (!delayed)
        x[7] = -4.0f;
    void *gx = up_bf16(x, nx), *gw = up_bf16(w, nw), *gg = dmalloc(nx * 2),
         *out_a = dmalloc(no * 2), *out_b = dmalloc(no * 2);
    uint8_t *qt_a = dmalloc(nx), *qt_b = dmalloc(nx), *q_a = dmalloc(nx), *q_b = dmalloc(nx);
    void *scratch = dmalloc(nn_cuda_fp8_conv1d_scratch_bytes(N, IC, OC));
    float hs[NN_FP8_CONV1D_SCALES] = { 0 };
    for (int j = 0; j < 3 && delayed; j++)
        hs[4 * j + 1] = 64.0f, hs[4 * j] = 1.0f / 64.0f;
    float *s_a = dmalloc(sizeof hs), *s_b = dmalloc(sizeof hs), *rec_a = zeros_dev(3),
          *rec_b = zeros_dev(3);
    h2d(s_a, hs, sizeof hs), h2d(s_b, hs, sizeof hs);
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    const nn_cuda_fp8_scales_t a = { s_a, rec_a, delayed, bad }, b = { s_b, rec_b, delayed, bad };
    bmt_error_t err;
    run(nn_cuda_gelu_forward(h, gg, gx, nx, &err), "gelu forward", &err);
    run(nn_cuda_fp8_conv1d_forward(h, out_a, qt_a, NULL, gg, 0, gw, NULL, N, IC, OC, 1, &a, scratch,
                                   &err),
        "fp8 conv1d forward of GELU's output", &err);
    run(nn_cuda_fp8_conv1d_forward(h, out_b, qt_b, NULL, gx, 1, gw, NULL, N, IC, OC, 1, &b, scratch,
                                   &err),
        "fp8 conv1d forward, GELU in the conversion", &err);
    run(nn_cuda_fp8_codes(h, q_a, NULL, gg, 0, N, IC, NN_FP8_E4M3, &a, 0, &err), "codes", &err);
    run(nn_cuda_fp8_codes(h, q_b, NULL, gx, 1, N, IC, NN_FP8_E4M3, &b, 0, &err), "codes, GELU",
        &err);
    uint8_t *h_qa = xmalloc(nx), *h_qb = xmalloc(nx), *h_ta = xmalloc(nx), *h_tb = xmalloc(nx);
    uint16_t *h_oa = xmalloc(no * 2), *h_ob = xmalloc(no * 2);
    float h_sa[NN_FP8_CONV1D_SCALES + 3], h_sb[NN_FP8_CONV1D_SCALES + 3];
    d2h(h_qa, q_a, nx), d2h(h_qb, q_b, nx), d2h(h_ta, qt_a, nx), d2h(h_tb, qt_b, nx);
    d2h(h_oa, out_a, no * 2), d2h(h_ob, out_b, no * 2);
    d2h(h_sa, s_a, sizeof hs), d2h(h_sb, s_b, sizeof hs);
    d2h(h_sa + NN_FP8_CONV1D_SCALES, rec_a, 12), d2h(h_sb + NN_FP8_CONV1D_SCALES, rec_b, 12);
    ok(memcmp(h_ta, h_tb, nx) == 0 && memcmp(h_qa, h_qb, nx) == 0,
       "GELU in the conversion, %d x %d, %s: the codes (row-major and transposed) equal those of "
       "nn_cuda_gelu_forward's output",
       N, IC, how);
    ok(memcmp(h_oa, h_ob, no * 2) == 0,
       "GELU in the conversion, %d x %d -> %d, %s: the product the same bits", N, IC, OC, how);
    ok(memcmp(h_sa, h_sb, sizeof h_sa) == 0 && (delayed ? isnan(h_sa[12]) : h_sa[12] > 0),
       "GELU in the conversion, %s: the scales and records the same bits (input's record %g)", how,
       h_sa[12]);
    /* the single-element kernels: rows of 24 values (not a multiple of 8) at
     * an odd element offset, transposed codes only */
    const nn_cuda_fp8_scales_t c = { s_a, NULL, 0, bad }, d = { s_b, NULL, 0, bad };
    const int R = 32, Cn = 24;
    run(nn_cuda_fp8_codes(h, NULL, qt_a, (uint16_t *)gg + 3, 0, R, Cn, NN_FP8_E5M2, &c, 2, &err),
        "codes, single elements", &err);
    run(nn_cuda_fp8_codes(h, NULL, qt_b, (uint16_t *)gx + 3, 1, R, Cn, NN_FP8_E5M2, &d, 2, &err),
        "codes, single elements, GELU", &err);
    d2h(h_ta, qt_a, (size_t)R * Cn), d2h(h_tb, qt_b, (size_t)R * Cn);
    d2h(h_sa, s_a, sizeof hs), d2h(h_sb, s_b, sizeof hs);
    ok(memcmp(h_ta, h_tb, (size_t)R * Cn) == 0 && memcmp(h_sa, h_sb, sizeof hs) == 0,
       "GELU in the single-element conversion (E5M2, current, amax %g): the same codes and scales",
       h_sa[10]);
    cudaFree(gx), cudaFree(gw), cudaFree(gg), cudaFree(out_a), cudaFree(out_b), cudaFree(qt_a),
        cudaFree(qt_b), cudaFree(q_a), cudaFree(q_b), cudaFree(scratch), cudaFree(s_a),
        cudaFree(s_b), cudaFree(rec_a), cudaFree(rec_b), cudaFree(bad);
    free(x), free(w), free(h_qa), free(h_qb), free(h_ta), free(h_tb), free(h_oa), free(h_ob);
}

/* GELU's input gradient made inside the backward's conversion
 * (nn_cuda_fp8_conv1d_backward's dgelu_pre) against nn_cuda_gelu_backward's
 * output passed as dout: dinp, dweight (added into a prior), the gradient's
 * scales and record, bit for bit; dbias (the conversion's column sums) bit
 * for bit where both take the 16-byte kernel, within 1e-6 of the column's
 * sum of magnitudes where pre is misaligned (the single-element kernel sums
 * 32-row blocks, not 64); a call for dbias alone gives the same bits as the
 * full call. Current scaling, or delayed at the gradient's own scale. */
static void t_dgelu(int N, int IC, int OC, int delayed, int misaligned)
{
    const size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
    const char *how = delayed ? "delayed" : "current";
    float *x = rnd_spread(nx, 1.0f, 1.0), *w = rnd_spread(nw, 0.02f, 1.0),
          *pre = rnd_spread(no, 1.5f, 1.0), *dout = rnd_spread(no, 1e-3f, 2.0),
          *prior = rnd_spread(nw, 1e-2f, 0.0), *bprior = rnd_spread(OC, 1e-2f, 0.0);
    pre[5] = 30.0f, pre[6] = -30.0f, pre[7] = 0.0f;
    void *gx = up_bf16(x, nx), *gw = up_bf16(w, nw), *gdout = up_bf16(dout, no),
         *gpre_buf = dmalloc((no + 8) * 2), *gg = dmalloc(no * 2), *out = dmalloc(no * 2);
    void *gpre = (uint16_t *)gpre_buf + (misaligned ? 1 : 0);
    put_bf16(gpre, pre, no);
    void *dinp_a = dmalloc(nx * 2), *dinp_b = dmalloc(nx * 2);
    float *dw_a = up_f32(prior, nw), *dw_b = up_f32(prior, nw), *db_a = up_f32(bprior, OC),
          *db_b = up_f32(bprior, OC), *db_c = up_f32(bprior, OC);
    uint8_t *xqt = dmalloc(nx);
    void *scratch = dmalloc(nn_cuda_fp8_conv1d_scratch_bytes(N, IC, OC));
    float hs[NN_FP8_CONV1D_SCALES] = { 0 };
    for (int j = 0; j < 3 && delayed; j++)
        hs[4 * j + 1] = j == 2 ? 8192.0f : 64.0f, hs[4 * j] = 1.0f / hs[4 * j + 1];
    float *s_a = dmalloc(sizeof hs), *s_b = dmalloc(sizeof hs), *s_c = dmalloc(sizeof hs),
          *rec_a = zeros_dev(3), *rec_b = zeros_dev(3);
    h2d(s_a, hs, sizeof hs), h2d(s_b, hs, sizeof hs), h2d(s_c, hs, sizeof hs);
    int *bad;
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    const nn_cuda_fp8_scales_t a = { s_a, rec_a, delayed, bad }, b = { s_b, rec_b, delayed, bad },
                               c = { s_c, NULL, delayed, bad };
    bmt_error_t err;
    /* the forward of each: the input's transposed codes and the weight's scale */
    run(nn_cuda_fp8_conv1d_forward(h, out, xqt, NULL, gx, 0, gw, NULL, N, IC, OC, 1, &a, scratch,
                                   &err),
        "fp8 conv1d forward", &err);
    run(nn_cuda_fp8_conv1d_forward(h, out, xqt, NULL, gx, 0, gw, NULL, N, IC, OC, 1, &b, scratch,
                                   &err),
        "fp8 conv1d forward", &err);
    run(nn_cuda_fp8_conv1d_forward(h, out, xqt, NULL, gx, 0, gw, NULL, N, IC, OC, 1, &c, scratch,
                                   &err),
        "fp8 conv1d forward", &err);
    run(nn_cuda_gelu_backward(h, gg, gpre, gdout, no, &err), "gelu backward", &err);
    run(nn_cuda_fp8_conv1d_backward(h, dinp_a, dw_a, db_a, gg, NULL, xqt, NULL, gw, N, IC, OC, &a,
                                    scratch, 1, &err),
        "fp8 conv1d backward of GELU's input gradient", &err);
    run(nn_cuda_fp8_conv1d_backward(h, dinp_b, dw_b, db_b, gdout, gpre, xqt, NULL, gw, N, IC, OC,
                                    &b, scratch, 1, &err),
        "fp8 conv1d backward, GELU's gradient in the conversion", &err);
    run(nn_cuda_fp8_conv1d_backward(h, NULL, NULL, db_c, gdout, gpre, NULL, NULL, gw, N, IC, OC, &c,
                                    scratch, 1, &err),
        "fp8 conv1d backward, dbias alone", &err);
    uint16_t *h_ia = xmalloc(nx * 2), *h_ib = xmalloc(nx * 2);
    d2h(h_ia, dinp_a, nx * 2), d2h(h_ib, dinp_b, nx * 2);
    float *h_wa = down_f32(dw_a, nw), *h_wb = down_f32(dw_b, nw), *h_ba = down_f32(db_a, OC),
          *h_bb = down_f32(db_b, OC), *h_bc = down_f32(db_c, OC), *g = down_bf16(gg, no);
    float h_sa[NN_FP8_CONV1D_SCALES + 3], h_sb[NN_FP8_CONV1D_SCALES + 3];
    d2h(h_sa, s_a, sizeof hs), d2h(h_sb, s_b, sizeof hs);
    d2h(h_sa + NN_FP8_CONV1D_SCALES, rec_a, 12), d2h(h_sb + NN_FP8_CONV1D_SCALES, rec_b, 12);
    const char *path = misaligned ? "single-element kernel" : "16-byte kernel";
    ok(memcmp(h_ia, h_ib, nx * 2) == 0 && memcmp(h_wa, h_wb, nw * 4) == 0,
       "GELU's gradient in the conversion, %d x %d -> %d, %s, %s: dinp and dweight the same bits "
       "as from nn_cuda_gelu_backward's output",
       N, IC, OC, how, path);
    ok(memcmp(h_sa, h_sb, sizeof h_sa) == 0 && h_sa[12 + 2] > 0,
       "GELU's gradient in the conversion, %s, %s: the scales and records the same bits "
       "(gradient's record %g)",
       how, path, h_sa[12 + 2]);
    double worst = 0;
    size_t differ = 0;
    for (int o = 0; o < OC; o++) {
        double sa = 0;
        for (int i = 0; i < N; i++)
            sa += fabs(g[(size_t)i * OC + o]);
        worst = fmax(worst, fabs((double)h_bb[o] - h_ba[o]) / (sa + 1e-30));
        differ += !same_bits(h_ba[o], h_bb[o]);
    }
    if (misaligned)
        ok(worst <= 1e-6,
           "GELU's gradient in the conversion, %s, %s: dbias within 1e-6 sum|dgelu| of the "
           "aligned kernel's (%.3g; %zu of %d differ in bits)",
           how, path, worst, differ, OC);
    else
        ok(differ == 0, "GELU's gradient in the conversion, %s, %s: dbias the same bits", how,
           path);
    ok(memcmp(h_bb, h_bc, OC * 4) == 0,
       "GELU's gradient in the conversion, %s, %s: a call for dbias alone gives the same bits", how,
       path);
    cudaFree(gx), cudaFree(gw), cudaFree(gdout), cudaFree(gpre_buf), cudaFree(gg), cudaFree(out),
        cudaFree(dinp_a), cudaFree(dinp_b), cudaFree(dw_a), cudaFree(dw_b), cudaFree(db_a),
        cudaFree(db_b), cudaFree(db_c), cudaFree(xqt), cudaFree(scratch), cudaFree(s_a),
        cudaFree(s_b), cudaFree(s_c), cudaFree(rec_a), cudaFree(rec_b), cudaFree(bad);
    free(x), free(w), free(pre), free(dout), free(prior), free(bprior), free(h_ia), free(h_ib),
        free(h_wa), free(h_wb), free(h_ba), free(h_bb), free(h_bc), free(g);
}

/* nn_cuda_fp8_advance against nn_fp8_plan_begin over 12 passes of 5 layers
 * with a history of 4: the records random (spread over 2^-20..2^20), some
 * growing 8x (saturation counted), a few NaN or inf, one operand with every
 * record of its window non-finite; the scales and descales bit for bit, the
 * statistics equal. The host's bookkeeping is the trainer's (fp8_begin). */
static void t_advance(void)
{
    enum {
        NP = 5,
        H = 4,
        PASSES = 12
    };
    nn_fp8_plan_t *plan = nn_fp8_plan_create(NP, H);
    float *s = zeros_dev(NP * NN_FP8_CONV1D_SCALES), *rec = zeros_dev(NP * 3),
          *hist = zeros_dev(H * NP * 3);
    unsigned long long *stats;
    int *bad;
    ck(cudaMalloc((void **)&stats, 16), "cudaMalloc");
    ck(cudaMalloc((void **)&bad, sizeof(int)), "cudaMalloc");
    ck(cudaMemsetAsync(stats, 0, 16, stream), "memset");
    ck(cudaMemsetAsync(bad, 0, sizeof(int), stream), "memset");
    int slot = 0, count = 0, delayed = 0, mismatch = 0;
    bmt_error_t err;
    float last[NP * 3];
    for (int i = 0; i < NP * 3; i++)
        last[i] = 1.0f;
    for (int pass = 0; pass < PASSES; pass++) {
        float r[NP * 3];
        for (int i = 0; i < NP * 3; i++) {
            const double u = uniform();
            r[i] = bf16r((float)ldexp(1.0 + uniform(), (int)(40 * uniform()) - 20));
            if (u < 0.15)
                r[i] = last[i] * 8.0f; /* grew past the window */
            else if (u < 0.2)
                r[i] = u < 0.175 ? NAN : INFINITY;
            if (i == 7 && pass >= 5 && pass <= 9) /* a window of non-finite records */
                r[i] = NAN;
            last[i] = isfinite(r[i]) ? r[i] : last[i];
            nn_fp8_plan_at(plan, i / 3)->amax[i % 3] = r[i];
        }
        h2d(rec, r, sizeof r);
        nn_fp8_plan_end(plan);
        nn_fp8_plan_begin(plan);
        count = count < H ? count + 1 : count;
        run(nn_cuda_fp8_advance(h, s, rec, hist, NP, H, slot, count, delayed, bad, stats, &err),
            "fp8 advance", &err);
        slot = (slot + 1) % H, delayed = 1;
        float gs[NP * NN_FP8_CONV1D_SCALES];
        d2h(gs, s, sizeof gs);
        for (int i = 0; i < NP * 3; i++) {
            const float want = nn_fp8_plan_at(plan, i / 3)->scale[i % 3];
            const float ws = want == 0.0f ? NAN : want, wd = want == 0.0f ? NAN : 1.0f / want;
            const float *g = &gs[(i / 3) * NN_FP8_CONV1D_SCALES + 4 * (i % 3)];
            if (!(isnan(ws) ? isnan(g[1]) && isnan(g[0])
                            : same_bits(g[1], ws) && same_bits(g[0], wd)))
                mismatch++;
        }
    }
    unsigned long long gst[2];
    int flag;
    d2h(gst, stats, sizeof gst);
    d2h(&flag, bad, sizeof flag);
    float left[NP * 3];
    d2h(left, rec, sizeof left);
    bool cleared = true;
    for (int i = 0; i < NP * 3; i++)
        cleared &= left[i] == 0.0f;
    const nn_fp8_stats_t st = nn_fp8_plan_stats(plan);
    ok(mismatch == 0 && (long)gst[0] == st.saturated && (long)gst[1] == st.unscalable &&
           st.saturated > 0 && st.unscalable > 0 && flag == 1 && cleared,
       "nn_cuda_fp8_advance against nn_fp8_plan_begin, %d passes of %d layers, history %d: every "
       "scale and descale bit for bit (%d differ), saturated %llu (cpu %ld), unscalable %llu (cpu "
       "%ld), the flag set by the window of NaN, the records cleared",
       PASSES, NP, H, mismatch, gst[0], st.saturated, gst[1], st.unscalable);
    cudaFree(s), cudaFree(rec), cudaFree(hist), cudaFree(stats), cudaFree(bad);
    nn_fp8_plan_destroy(plan);
}

/* The forward's product (E4M3 x E4M3, a bias, fast accumulation), and
 * descales off 16-byte alignment refused by name (cuBLASLt's heuristic takes
 * them, then cublasLtMatmul answers "not supported": seen on the H200). */
static void t_probe(void)
{
    uint8_t *q = dmalloc(64 * 64);
    float *sc = dmalloc(64), one[16];
    void *out = dmalloc(64 * 64 * 2), *bias = dmalloc(64 * 2);
    for (int i = 0; i < 16; i++)
        one[i] = 1.0f;
    h2d(sc, one, sizeof(one));
    ck(cudaMemsetAsync(q, 0x38, 64 * 64, stream), "memset"); /* 1.0 in E4M3 */
    ck(cudaMemsetAsync(bias, 0, 64 * 2, stream), "memset");
    bmt_error_t err;
    for (int off = 1; off <= 2; off++) {
        err.text[0] = '\0';
        int rc = nn_cuda_fp8_matmul(h, out, 0, 64, q, NN_FP8_E4M3, sc + off, q, NN_FP8_E4M3, sc,
                                    NULL, 0.0f, 0, 16 * off, 64, 64, &err);
        ok(rc < 0 && strstr(err.text, "descales must be 16-byte aligned") != NULL,
           "a descale %d bytes off 16-byte alignment refused by name: %s", 4 * off, err.text);
    }
    err.text[0] = '\0';
    int rc = nn_cuda_fp8_matmul(h, out, 0, 64, q, NN_FP8_E4M3, sc, q, NN_FP8_E4M3, sc + 4, bias,
                                0.0f, 1, 48, 64, 64, &err);
    uint16_t o = 0;
    if (rc == 0)
        d2h(&o, out, 2);
    ok(rc == 0 && bmt_bf16_to_f32(o) == 64.0f,
       "the forward's product (E4M3 x E4M3, a bias, fast accumulation) runs: %s%g",
       rc == 0 ? "" : err.text, rc == 0 ? bmt_bf16_to_f32(o) : 0.0);
    cudaFree(q), cudaFree(sc), cudaFree(out), cudaFree(bias);
}

static void t_refusals(void)
{
    uint8_t *q = dmalloc(4096);
    float *s = dfloat(1.0f);
    void *out = dmalloc(4096 * 4);
    bmt_error_t err;
    err.text[0] = '\0';
    ok(nn_cuda_fp8_matmul(h, out, 0, 16, q, NN_FP8_E5M2, s, q, NN_FP8_E5M2, s, NULL, 0, 0, 16, 16,
                          16, &err) < 0 &&
           strstr(err.text, "no E5M2 x E5M2") != NULL,
       "E5M2 x E5M2 refused: %s", err.text);
    ok(nn_cuda_fp8_matmul(h, out, 0, 16, q, NN_FP8_E4M3, s, q, NN_FP8_E4M3, s, NULL, 0, 0, 16, 40,
                          16, &err) < 0 &&
           strstr(err.text, "K must be a multiple of 16") != NULL,
       "K 40 refused: %s", err.text);
    ok(nn_cuda_fp8_matmul(h, out, 0, 16, q + 1, NN_FP8_E4M3, s, q, NN_FP8_E4M3, s, NULL, 0, 0, 16,
                          16, 16, &err) < 0,
       "a misaligned operand refused: %s", err.text);
    ok(nn_cuda_fp8_matmul(h, out, 1, 16, q, NN_FP8_E4M3, s, q, NN_FP8_E4M3, s, q, 0, 0, 16, 16, 16,
                          &err) < 0,
       "a bias with an f32 output refused: %s", err.text);
    ok(nn_cuda_fp8_quantize(h, q, NULL, out, 24, 16, 24, s, NN_FP8_E4M3, NULL, &err) < 0,
       "quantize to rows of 24 codes refused: %s", err.text);
    const nn_cuda_fp8_scales_t sc = { s, NULL, 0, (int *)q };
    ok(nn_cuda_fp8_conv1d_forward(h, out, NULL, NULL, out, 0, out, NULL, 24, 16, 16, 0, &sc, q,
                                  &err) < 0 &&
           strstr(err.text, "multiple of 16") != NULL,
       "a linear layer of 24 rows refused: %s", err.text);
    cudaFree(q), cudaFree(s), cudaFree(out);
}

int main(void)
{
    bmt_error_t err;
    void *ws;
    ck(cudaSetDevice(0), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    ck(cudaMalloc(&ws, nn_cuda_workspace_bytes(8192)), "cudaMalloc");
    if ((h = nn_cuda_create(stream, ws, 8192, &err)) == NULL)
        die("nn_cuda_create", err.text);
    t_all_bf16();
    t_scales();
    t_pipeline(1008, 208, 0);
    t_pipeline(64, 4112, 2);
    t_cast_and_edges(208, 1008);
    t_cast_and_edges(48, 4096);
    t_matmul("forward-like, fast accumulation", NN_FP8_E4M3, NN_FP8_E4M3, 0, 0, 0.0f, 1, 1000, 768,
             520);
    t_matmul("dgrad-like, bias", NN_FP8_E5M2, NN_FP8_E4M3, 0, 1, 0.0f, 0, 512, 2048, 384);
    t_matmul("wgrad-like, f32 added into", NN_FP8_E4M3, NN_FP8_E5M2, 1, 0, 1.0f, 0, 256, 4096, 192);
    t_vs_bf16(NN_FP8_E4M3, 1024, 1024, 1024, 0.08);
    t_vs_bf16(NN_FP8_E5M2, 1024, 1024, 1024, 0.15);
    t_probe();
    for (int wt = 0; wt < 2; wt++) {
        t_layer(512, 192, 576, 0, wt);
        t_layer(256, 768, 192, 0, wt);
        t_layer(512, 192, 576, 1, wt);
        t_layer(256, 768, 192, 1, wt);
    }
    t_gelu(512, 768, 192, 0);
    t_gelu(512, 768, 192, 1);
    t_dgelu(512, 192, 768, 0, 0);
    t_dgelu(512, 192, 768, 1, 0);
    t_dgelu(256, 96, 384, 0, 1);
    t_dgelu(256, 96, 384, 1, 1);
    t_advance();
    t_refusals();
    nn_cuda_destroy(h);
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
#endif
