/* tests/unit/test_fp8.c — nn/fp8.h's own logic: every code survives a
 * decode-encode roundtrip, conversion is monotonic, the scale and the delayed
 * scaling history keep their contracts (NaN and inf refused, the window
 * slides). The values themselves are checked against the formats' definitions
 * in tests/integration/test_fp8.sh.
 */
#include <math.h>
#include <string.h>

#include "nn/fp8.h"
#include "tap.h"

static const char *NAME[2] = { "E4M3", "E5M2" };

static void codes(nn_fp8_kind_t k)
{
    int bad = 0, nans = 0, infs = 0;
    for (int c = 0; c < 256; c++) {
        float v = nn_fp8_to_f32((uint8_t)c, k);
        if (isnan(v)) {
            nans++;
            bad += !isnan(nn_fp8_to_f32(nn_fp8_from_f32(v, k), k));
        } else if (isinf(v)) {
            infs++;
            bad += nn_fp8_from_f32(v, k) != ((c & 0x80) | (k == NN_FP8_E4M3 ? 0x7e : 0x7b));
        } else {
            bad += nn_fp8_from_f32(v, k) != c;
        }
    }
    ok(bad == 0, "%s: every finite code encodes back to itself; infinities saturate", NAME[k]);
    is_int(nans, k == NN_FP8_E4M3 ? 2 : 6, "NaN codes");
    is_int(infs, k == NN_FP8_E4M3 ? 0 : 2, "infinity codes");
    ok(nn_fp8_to_f32(0x7e, k) == nn_fp8_max(k) || nn_fp8_to_f32(0x7b, k) == nn_fp8_max(k),
       "%s: the largest finite code is the largest value", NAME[k]);
    ok(nn_fp8_from_f32(-0.0f, k) == 0x80 && nn_fp8_from_f32(0.0f, k) == 0x00,
       "%s: -0 keeps its sign", NAME[k]);
    ok(nn_fp8_from_f32(1e30f, k) == nn_fp8_from_f32(nn_fp8_max(k), k) &&
           nn_fp8_from_f32(-INFINITY, k) == (0x80 | nn_fp8_from_f32(nn_fp8_max(k), k)),
       "%s: beyond the largest value and -inf saturate", NAME[k]);
}

/* Between consecutive positive codes the conversion never goes back. */
static void monotonic(nn_fp8_kind_t k)
{
    int bad = 0;
    float prev = 0.0f;
    for (float x = 1e-9f; x < 1e6f; x *= 1.0009f) {
        float v = nn_fp8_to_f32(nn_fp8_from_f32(x, k), k);
        bad += v < prev || fabsf(v - x) > x; /* never more than x away */
        prev = v;
    }
    ok(bad == 0, "%s: conversion is monotonic over 1e-9 .. 1e6", NAME[k]);
}

static void scales(void)
{
    ok(nn_fp8_scale(448.0f, NN_FP8_E4M3, 0) == 1.0f, "scale of amax 448 for E4M3 is 1");
    ok(nn_fp8_scale(1.0f, NN_FP8_E5M2, 2) == 57344.0f / 4, "margin 2 divides by 4");
    ok(nn_fp8_scale(0.0f, NN_FP8_E4M3, 0) == 1.0f, "amax 0: scale 1");
    ok(nn_fp8_scale(NAN, NN_FP8_E4M3, 0) == 0.0f &&
           nn_fp8_scale(INFINITY, NN_FP8_E4M3, 0) == 0.0f &&
           nn_fp8_scale(-1.0f, NN_FP8_E4M3, 0) == 0.0f &&
           nn_fp8_scale(1e-40f, NN_FP8_E4M3, 0) == 0.0f,
       "amax NaN, inf, negative or too small: 0 (cannot scale)");
    ok(nn_fp8_scale(1.0f, NN_FP8_E4M3, -1) == 0.0f, "a negative margin: 0");
}

static void quantize(void)
{
    float x[6] = { 1.0f, -2.0f, 100.0f, 0.001f, NAN, 3.0f };
    uint8_t q[6];
    size_t sat = 99;
    float m = nn_fp8_quantize(q, x, 4, 4.48f, NN_FP8_E4M3, &sat);
    ok(m == 100.0f && sat == 0, "quantize: amax of the tensor, nothing saturated at its scale");
    nn_fp8_quantize(q, x, 4, 10.0f, NN_FP8_E4M3, &sat);
    is_int((long long)sat, 1, "quantize at 10x: 100 saturates, counted");
    ok(nn_fp8_to_f32(q[2], NN_FP8_E4M3) == 448.0f, "...and is stored as the largest value");
    m = nn_fp8_quantize(q, x, 6, 1.0f, NN_FP8_E4M3, NULL);
    ok(isnan(m), "quantize: a NaN element makes the amax NaN");
    float y[3] = { 1.0f, NAN, 2.0f };
    ok(nn_fp8_roundtrip(y, 3, NN_FP8_E4M3) == 0.0f && y[0] == 1.0f && y[2] == 2.0f,
       "roundtrip of a tensor with a NaN: 0, the tensor unchanged");
    float z[2] = { 0.3f, -0.7f };
    float s = nn_fp8_roundtrip(z, 2, NN_FP8_E4M3);
    ok(s == 448.0f / 0.7f && z[1] == -0.7f && fabsf(z[0] - 0.3f) <= 0.3f / 16,
       "roundtrip: the amax comes back exactly, the rest within 2^-4");
    uint8_t a[2 * 3], b[2 * 3];
    float one[6] = { 1, 2, 3, 4, 5, 6 }, out[4];
    nn_fp8_quantize(a, one, 6, 1.0f, NN_FP8_E4M3, NULL);
    nn_fp8_quantize(b, one, 6, 1.0f, NN_FP8_E5M2, NULL);
    nn_fp8_matmul(out, a, NN_FP8_E4M3, b, NN_FP8_E5M2, 0.5f, 2, 3, 2);
    ok(out[0] == 7.0f && out[1] == 16.0f && out[2] == 16.0f && out[3] == 38.5f,
       "matmul: (a b^T) * descale on exact values");
}

static void history(void)
{
    nn_fp8_history_t h;
    ok(nn_fp8_history_init(&h, 0) == -1 && nn_fp8_history_init(&h, NN_FP8_HISTORY_MAX + 1) == -1,
       "history: window 0 or above the limit refused");
    ok(nn_fp8_history_init(&h, 3) == 0 && nn_fp8_history_scale(&h, NN_FP8_E4M3, 0) == 0.0f,
       "history: empty gives 0 (use current scaling)");
    nn_fp8_history_push(&h, 4.0f);
    nn_fp8_history_push(&h, 1.0f);
    ok(nn_fp8_history_scale(&h, NN_FP8_E4M3, 0) == 112.0f, "history: max of the window (4)");
    ok(nn_fp8_history_push(&h, NAN) == -1 && h.count == 3 &&
           nn_fp8_history_scale(&h, NN_FP8_E4M3, 0) == 112.0f,
       "history: a NaN is flagged and takes its slot; the scale comes from the finite ones");
    nn_fp8_history_push(&h, 2.0f); /* 4 falls out */
    ok(nn_fp8_history_scale(&h, NN_FP8_E4M3, 1) == 112.0f,
       "history: the window slides (max 2), margin 1");
    is_int(h.count, 3, "history: count stays at the window");
    ok(nn_fp8_history_push(&h, INFINITY) == -1 && nn_fp8_history_push(&h, NAN) == -1 &&
           nn_fp8_history_push(&h, INFINITY) == -1 &&
           nn_fp8_history_scale(&h, NN_FP8_E4M3, 0) == 0.0f,
       "history: a window of only inf and NaN gives 0 (nothing to scale by)");
}

int main(void)
{
    codes(NN_FP8_E4M3);
    codes(NN_FP8_E5M2);
    monotonic(NN_FP8_E4M3);
    monotonic(NN_FP8_E5M2);
    scales();
    quantize();
    history();
    return done_testing();
}
