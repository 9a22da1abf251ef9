/* nn/fp8.c — FP8 conversions, scales and the scaled product in plain C (see fp8.h).
 *
 * Conversion works on values, not bits: for a finite x, the quantum of the FP8
 * binade x falls in is 2^(e - mbits) with e = max(floor(log2 |x|), emin) (the
 * subnormals share the smallest normal binade's quantum), and the nearest FP8
 * value is rint(|x| / quantum) * quantum under the default rounding mode
 * (nearest, ties to even: the even multiple of the quantum is the even
 * mantissa). |x| / quantum and the product back are exact (powers of two, far
 * from f32's limits), so the only rounding is rint's. A result one quantum past
 * the binade's top is the next binade's first value, which encodes the same way.
 * Saturation comes after rounding, as in CUDA's cvt.satfinite: a value that
 * rounds to at most the largest finite value is not saturated.
 * The independent check is tests/tools/fp8_oracle.py, which enumerates the 256
 * codes from the format's definition and picks the nearest by search.
 */
#include "fp8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"

typedef struct fmt {
    int mbits;   /* mantissa bits */
    int bias;    /* exponent bias */
    int emin;    /* exponent of the smallest normal binade */
    float max;   /* largest finite value */
    uint8_t nan; /* a NaN code without sign */
} fmt_t;

static const fmt_t FMT[2] = {
    [NN_FP8_E4M3] = { 3, 7, -6, 448.0f, 0x7f },
    [NN_FP8_E5M2] = { 2, 15, -14, 57344.0f, 0x7f },
};

float nn_fp8_max(nn_fp8_kind_t kind) { return FMT[kind].max; }

float nn_fp8_saturation(nn_fp8_kind_t kind) { return kind == NN_FP8_E5M2 ? 61440.0f : 464.0f; }

float nn_fp8_to_f32(uint8_t q, nn_fp8_kind_t kind)
{
    const fmt_t *f = &FMT[kind];
    const int ebits = 7 - f->mbits;
    const int ef = (q >> f->mbits) & ((1 << ebits) - 1);
    const int m = q & ((1 << f->mbits) - 1);
    const float sign = (q & 0x80) ? -1.0f : 1.0f;
    if (kind == NN_FP8_E4M3 && ef == 15 && m == 7)
        return NAN;
    if (kind == NN_FP8_E5M2 && ef == 31)
        return m == 0 ? sign * INFINITY : NAN;
    if (ef == 0) /* subnormal: m * 2^(emin - mbits) */
        return sign * ldexpf((float)m, f->emin - f->mbits);
    return sign * ldexpf((float)((1 << f->mbits) + m), ef - f->bias - f->mbits);
}

/* |x| (finite, > 0) rounded to the format's precision, before saturation: may
 * exceed the largest finite value. */
static float round_mag(float a, const fmt_t *f)
{
    int e2;
    (void)frexpf(a, &e2); /* a = frac 2^e2, frac in [0.5, 1): floor(log2 a) = e2 - 1 */
    int e = e2 - 1 < f->emin ? f->emin : e2 - 1;
    if (e > f->emin + 40) /* far above the largest binade: saturates anyway */
        e = f->emin + 40;
    const int qexp = e - f->mbits; /* the quantum is 2^qexp */
    return ldexpf(rintf(ldexpf(a, -qexp)), qexp);
}

uint8_t nn_fp8_from_f32(float x, nn_fp8_kind_t kind)
{
    const fmt_t *f = &FMT[kind];
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return sign | f->nan;
    float a = fabsf(x);
    if (a == 0.0f)
        return sign;
    float v = isinf(a) ? f->max : fminf(round_mag(a, f), f->max);
    if (v == 0.0f) /* at most half the smallest subnormal */
        return sign;
    /* encode v: an FP8 value, so the fields below are exact */
    int e2;
    (void)frexpf(v, &e2);
    const int ev = e2 - 1;
    if (ev < f->emin) /* subnormal: v = m 2^(emin - mbits) */
        return sign | (uint8_t)(int)ldexpf(v, f->mbits - f->emin);
    const int mant = (int)ldexpf(v, f->mbits - ev) - (1 << f->mbits);
    return sign | (uint8_t)(((ev + f->bias) << f->mbits) | mant);
}

float nn_fp8_scale(float amax, nn_fp8_kind_t kind, int margin)
{
    if (isnan(amax) || isinf(amax) || amax < 0.0f || margin < 0 || margin > 64)
        return 0.0f;
    if (amax == 0.0f)
        return 1.0f;
    volatile float s = FMT[kind].max / amax; /* one f32 division, not fused away */
    float scaled = ldexpf(s, -margin);
    return isfinite(scaled) && scaled > 0.0f ? scaled : 0.0f;
}

float nn_fp8_amax(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (isnan(a))
            return NAN;
        if (a > m)
            m = a;
    }
    return m;
}

float nn_fp8_quantize(uint8_t *q, const float *x, size_t n, float scale, nn_fp8_kind_t kind,
                      size_t *saturated)
{
    const fmt_t *f = &FMT[kind];
    size_t sat = 0;
    float m = 0.0f;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (isnan(a))
            nan = 1;
        else if (a > m)
            m = a;
        volatile float y = x[i] * scale; /* rounded to f32 alone, as on the GPU */
        const float ya = fabsf(y);
        if (isfinite(a) && ya > f->max && (isinf(ya) || round_mag(ya, f) > f->max))
            sat++;
        q[i] = nn_fp8_from_f32(y, kind);
    }
    if (saturated)
        *saturated = sat;
    return nan ? NAN : m;
}

float nn_fp8_roundtrip(float *x, size_t n, nn_fp8_kind_t kind)
{
    const float scale = nn_fp8_scale(nn_fp8_amax(x, n), kind, 0);
    if (scale == 0.0f)
        return 0.0f;
    for (size_t i = 0; i < n; i++) {
        volatile float y = x[i] * scale;
        x[i] = nn_fp8_to_f32(nn_fp8_from_f32(y, kind), kind) / scale;
    }
    return scale;
}

void nn_fp8_matmul(float *out, const uint8_t *a, nn_fp8_kind_t ka, const uint8_t *b,
                   nn_fp8_kind_t kb, float descale, int N, int K, int OC)
{
    float la[256], lb[256]; /* the codes' values */
    for (int c = 0; c < 256; c++) {
        la[c] = nn_fp8_to_f32((uint8_t)c, ka);
        lb[c] = nn_fp8_to_f32((uint8_t)c, kb);
    }
    for (int n = 0; n < N; n++) {
        const uint8_t *ar = a + (size_t)n * K;
        for (int o = 0; o < OC; o++) {
            const uint8_t *br = b + (size_t)o * K;
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += (double)la[ar[k]] * (double)lb[br[k]];
            out[(size_t)n * OC + o] = (float)(acc * (double)descale);
        }
    }
}

int nn_fp8_history_init(nn_fp8_history_t *h, int len)
{
    if (len < 1 || len > NN_FP8_HISTORY_MAX)
        return -1;
    h->len = len;
    h->count = 0;
    h->next = 0;
    return 0;
}

int nn_fp8_history_push(nn_fp8_history_t *h, float amax)
{
    h->amax[h->next] = amax;
    h->next = (h->next + 1) % h->len;
    if (h->count < h->len)
        h->count++;
    return isfinite(amax) && amax >= 0.0f ? 0 : -1;
}

float nn_fp8_history_scale(const nn_fp8_history_t *h, nn_fp8_kind_t kind, int margin)
{
    float m = -1.0f;
    for (int i = 0; i < h->count; i++)
        if (isfinite(h->amax[i]) && h->amax[i] > m)
            m = h->amax[i];
    return m < 0.0f ? 0.0f : nn_fp8_scale(m, kind, margin);
}

/* *rec = the larger of *rec and a, NaN once either is NaN (max otherwise,
 * inf included): the GPU's atomicMax on the magnitudes' bit patterns. */
static void record(float *rec, float a)
{
    if (isnan(*rec) || isnan(a))
        *rec = NAN;
    else if (a > *rec)
        *rec = a;
}

/* A copy of x (n) passed through kind: at its current scale (delayed 0), or
 * at scale with an infinity becoming NaN; NaN everywhere (*poisoned = 1)
 * when x cannot be scaled; NULL when out of memory. *rec, if rec, gets x's
 * amax (record). */
static float *through(const float *x, size_t n, nn_fp8_kind_t kind, int delayed, float scale,
                      float *rec, int *poisoned)
{
    float *y = malloc(n * sizeof(float));
    if (y == NULL)
        return NULL;
    memcpy(y, x, n * sizeof(float));
    float amax = 0.0f;
    for (size_t i = 0; i < n && !isnan(amax); i++) /* NaN wins, then inf, then the max */
        amax = isnan(x[i]) ? NAN : fmaxf(amax, fabsf(x[i]));
    if (rec)
        record(rec, amax);
    if (!delayed)
        scale = nn_fp8_roundtrip(y, n, kind);
    else if (scale != 0.0f)
        for (size_t i = 0; i < n; i++) {
            volatile float v = isinf(y[i]) ? NAN : y[i] * scale; /* f32, as on the GPU */
            y[i] = nn_fp8_to_f32(nn_fp8_from_f32(v, kind), kind) / scale;
        }
    if (scale == 0.0f) {
        for (size_t i = 0; i < n; i++)
            y[i] = NAN;
        *poisoned = 1;
    }
    return y;
}

/* through() for operand j (0 input, 1 weight: E4M3; 2 gradient: E5M2) as
 * sc scales it (NULL: current scaling, no record). */
static float *operand(nn_fp8_scaling_t *sc, int j, const float *x, size_t n, int *poisoned)
{
    const int d = sc && sc->delayed;
    return through(x, n, j == 2 ? NN_FP8_E5M2 : NN_FP8_E4M3, d, d ? sc->scale[j] : 0.0f,
                   sc ? &sc->amax[j] : NULL, poisoned);
}

int nn_fp8_linear_forward(nn_fp8_scaling_t *sc, float *out, const float *inp, const float *weight,
                          const float *bias, int N, int IC, int OC, int wt)
{
    int poisoned = 0;
    float *x = operand(sc, 0, inp, (size_t)N * IC, &poisoned);
    float *w = x ? operand(sc, 1, weight, (size_t)IC * OC, &poisoned) : NULL;
    if (w && poisoned) {
        for (size_t i = 0; i < (size_t)N * OC; i++)
            out[i] = NAN;
    } else if (w) {
        nn_conv1d_forward(out, x, w, bias, N, IC, OC, wt);
    }
    free(x);
    free(w);
    return w == NULL ? -1 : poisoned;
}

int nn_fp8_linear_backward(nn_fp8_scaling_t *sc, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int N, int IC,
                           int OC, int wt)
{
    int poisoned = 0;
    float *g = operand(sc, 2, dout, (size_t)N * OC, &poisoned);
    float *x = g ? operand(sc, 0, inp, (size_t)N * IC, &poisoned) : NULL;
    float *w = x ? operand(sc, 1, weight, (size_t)IC * OC, &poisoned) : NULL;
    if (w) {
        if (poisoned) {
            for (size_t i = 0; dinp && i < (size_t)N * IC; i++)
                dinp[i] += NAN;
            for (size_t i = 0; dweight && i < (size_t)IC * OC; i++)
                dweight[i] += NAN;
        } else {
            nn_conv1d_backward(dinp, dweight, NULL, g, x, w, N, IC, OC, wt);
        }
        if (dbias) /* from the unrounded dout */
            nn_conv1d_backward(NULL, NULL, dbias, dout, NULL, NULL, N, IC, OC, wt);
    }
    free(g);
    free(x);
    free(w);
    return w == NULL ? -1 : poisoned;
}

int nn_fp8_conv1d_forward(float *out, const float *inp, const float *weight, const float *bias,
                          int N, int IC, int OC, int wt)
{
    return nn_fp8_linear_forward(NULL, out, inp, weight, bias, N, IC, OC, wt);
}

int nn_fp8_conv1d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int IC, int OC, int wt)
{
    return nn_fp8_linear_backward(NULL, dinp, dweight, dbias, dout, inp, weight, N, IC, OC, wt);
}

struct nn_fp8_plan {
    int n, history, ended;
    nn_fp8_scaling_t *sc;   /* n */
    nn_fp8_history_t *hist; /* 3 n, with delayed scaling */
    nn_fp8_stats_t stats;
};

nn_fp8_plan_t *nn_fp8_plan_create(int n, int history)
{
    if (n < 1 || history < 0 || history > NN_FP8_HISTORY_MAX)
        return NULL;
    nn_fp8_plan_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->n = n, p->history = history;
    p->sc = calloc((size_t)n, sizeof(*p->sc));
    p->hist = history ? calloc((size_t)n * 3, sizeof(*p->hist)) : NULL;
    if (p->sc == NULL || (history && p->hist == NULL)) {
        nn_fp8_plan_destroy(p);
        return NULL;
    }
    for (int i = 0; history && i < 3 * n; i++)
        nn_fp8_history_init(&p->hist[i], history);
    return p;
}

void nn_fp8_plan_destroy(nn_fp8_plan_t *p)
{
    if (p == NULL)
        return;
    free(p->sc);
    free(p->hist);
    free(p);
}

nn_fp8_scaling_t *nn_fp8_plan_at(nn_fp8_plan_t *p, int i) { return &p->sc[i]; }

void nn_fp8_plan_begin(nn_fp8_plan_t *p)
{
    if (!p->ended)
        return;
    p->ended = 0;
    p->stats.passes++;
    for (int i = 0; i < p->n; i++) {
        nn_fp8_scaling_t *sc = &p->sc[i];
        for (int j = 0; j < 3; j++) {
            const nn_fp8_kind_t kind = j == 2 ? NN_FP8_E5M2 : NN_FP8_E4M3;
            const float rec = sc->amax[j];
            if (!isfinite(rec))
                p->stats.unscalable++;
            else if (sc->delayed) {
                volatile float top = rec * sc->scale[j]; /* f32, as on the GPU */
                if (top > nn_fp8_saturation(kind))
                    p->stats.saturated++;
            }
            sc->amax[j] = 0.0f;
            if (p->history == 0)
                continue;
            nn_fp8_history_push(&p->hist[3 * i + j], rec);
            sc->scale[j] = nn_fp8_history_scale(&p->hist[3 * i + j], kind, 0);
            if (sc->scale[j] == 0.0f)
                p->stats.unscalable++;
        }
        sc->delayed = p->history > 0;
    }
}

void nn_fp8_plan_end(nn_fp8_plan_t *p) { p->ended = 1; }

nn_fp8_stats_t nn_fp8_plan_stats(const nn_fp8_plan_t *p) { return p->stats; }

int nn_linear_forward(nn_fp8_scaling_t *sc, float *out, const float *inp, const float *weight,
                      const float *bias, int N, int IC, int OC, int wt)
{
    if (sc)
        return nn_fp8_linear_forward(sc, out, inp, weight, bias, N, IC, OC, wt) < 0 ? -1 : 0;
    nn_conv1d_forward(out, inp, weight, bias, N, IC, OC, wt);
    return 0;
}

int nn_linear_backward(nn_fp8_scaling_t *sc, float *dinp, float *dweight, float *dbias,
                       const float *dout, const float *inp, const float *weight, int N, int IC,
                       int OC, int wt)
{
    if (sc)
        return nn_fp8_linear_backward(sc, dinp, dweight, dbias, dout, inp, weight, N, IC, OC, wt) <
                       0
                   ? -1
                   : 0;
    nn_conv1d_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, wt);
    return 0;
}
