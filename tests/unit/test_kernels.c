/* tests/unit/test_kernels.c — the element-wise kernels on the cpu (runtime/kernels.c)
 * and the generator behind them (runtime/philox.h).
 *
 * A cpu context is made by hand (no bmt_init). Every check compares with a
 * reference computed here on its own, mostly in double precision:
 *   Philox 4x32   Random123's known-answer vectors (tests/kat_vectors of
 *                 github.com/DEShawResearch/random123), 10 and 7 rounds;
 *   init          each distribution re-derived from the raw Philox words; the
 *                 truncated normal checked through Phi (erfc) instead of
 *                 re-inverted; kern_init equal to bmt_init_value rounded, bit for
 *                 bit, and the same bits whatever pieces [0, N) is filled in
 *                 (DESIGN.md §4 invariant 2); statistics of 1e6 samples (bounds
 *                 of about five standard errors, chi-square over 20 bins with a
 *                 p ~ 1e-6 cut); names and seeds give unrelated streams;
 *   cast          round-to-nearest-even by comparing distances in double, ties,
 *                 NaN, inf, overflow, subnormals, and every bf16 pattern back;
 *   accumulate    f32 sums (double rounding through double is innocuous);
 *   sumsq         a Neumaier-compensated sum, within 1e-12, NaN and inf;
 *   adamw         torch.optim.AdamW's formulas in double over 10 steps; and
 *                 torch itself when /usr/bin/python3 can import torch.
 * Golden values pin the init stream: changing them changes every model's
 * initial weights (and every checkpoint-free comparison across versions).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bmt/bmt.h"
#include "bmt/block.h"
#include "ctx.h"
#include "cuda/kernels_cuda.h"
#include "hash.h"
#include "kernels.h"
#include "philox.h"
#include "tap.h"

static bmt_ctx_t *ctx;

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x243f6a8885a308d3ULL;

static uint64_t rnd64(void) /* splitmix64: test inputs, unrelated to Philox */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rnd_unit(void) { return (double)(rnd64() >> 11) * 0x1p-53; }

/* Uniform in [-1, 1) times 2^e with e in [-lo, hi]: varied magnitudes, never 0. */
static float rnd_float(int lo, int hi)
{
    double u;
    do
        u = rnd_unit() * 2.0 - 1.0;
    while (u == 0.0);
    int e = (int)(rnd64() % (uint64_t)(lo + hi + 1)) - lo;
    return (float)ldexp(u, e);
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static double Phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

/* Independent of philox_u01: the 53 top bits as hi * 2^21 + lo / 2^11. */
static double ref_u01(uint32_t hi, uint32_t lo)
{
    double bits = (double)hi * 2097152.0 + (double)(lo >> 11);
    return bits == 0.0 ? ldexp(1.0, -54) : ldexp(bits, -53);
}

/* ------------------------------------------------------------ philox */

static void test_philox_kat(void)
{
    /* Random123 tests/kat_vectors: name rounds ctr[4] key[2] expected[4]. */
    static const struct {
        int rounds;
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        { 10, { 0, 0, 0, 0 }, { 0, 0 }, { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 } },
        { 10,
          { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff },
          { 0xffffffff, 0xffffffff },
          { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd } },
        { 10,
          { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 },
          { 0xa4093822, 0x299f31d0 },
          { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 } },
        { 7, { 0, 0, 0, 0 }, { 0, 0 }, { 0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48 } },
        { 7,
          { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff },
          { 0xffffffff, 0xffffffff },
          { 0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662 } },
        { 7,
          { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 },
          { 0xa4093822, 0x299f31d0 },
          { 0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a } },
    };
    static const char *what[] = { "zeros", "ones", "pi digits" };
    for (size_t i = 0; i < sizeof(kat) / sizeof(kat[0]); i++) {
        uint32_t out[4];
        if (kat[i].rounds == 10)
            philox4x32_10(kat[i].ctr, kat[i].key, out);
        else
            philox4x32_rounds(kat[i].ctr, kat[i].key, kat[i].rounds, out);
        int same = memcmp(out, kat[i].want, sizeof(out)) == 0;
        ok(same, "philox4x32-%d known answer: %s", kat[i].rounds, what[i % 3]);
        if (!same)
            diag("got %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
    }
}

/* ------------------------------------------------------------ init: values */

static void test_key(void)
{
    static const struct {
        uint64_t seed;
        const char *name;
    } cases[] = { { 0, "" }, { 1, "wte.weight" }, { 42, "h.3.mlp.c_fc.weight" }, { ~0ULL, "x" } };
    bool all = true;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t key[2];
        kern_init_key(cases[i].seed, cases[i].name, key);
        /* The documented derivation, spelled out again. */
        uint64_t h = 0xcbf29ce484222325ULL;
        for (const char *s = cases[i].name; *s; s++)
            h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
        uint64_t k = mix64(h ^ mix64(cases[i].seed ^ 0x5eedULL));
        all &= key[0] == (uint32_t)k && key[1] == (uint32_t)(k >> 32);
    }
    ok(all, "kern_init_key = mix64(fnv1a(name) ^ mix64(seed ^ 0x5eed)), split lo/hi");

    /* Golden values (seed 1234, "h.0.attn.c_attn.weight"): the stream must not
     * change between versions. Within 1e-15 relative, for another libm. */
    static const struct {
        bmt_init_t init;
        uint64_t index;
        double want;
    } golden[] = {
        { { BMT_INIT_NORMAL, 0.0, 0.02, 1 }, 0, -0x1.ec4668a90df41p-8 },
        { { BMT_INIT_NORMAL, 0.0, 0.02, 1 }, 1, -0x1.072065d114e3fp-7 },
        { { BMT_INIT_NORMAL, 0.0, 0.02, 1 }, 5000000000ULL, 0x1.7fa21efedd3a1p-10 },
        { { BMT_INIT_UNIFORM, -1.0, 1.0, 1 }, 7, -0x1.123fd4a58197cp-2 },
        { { BMT_INIT_TRUNC_NORMAL, 0.0, 1.0, 1 }, 3, -0x1.5236f04d6bb8fp-1 },
    };
    for (size_t i = 0; i < sizeof(golden) / sizeof(golden[0]); i++) {
        double v = bmt_init_value(1234, "h.0.attn.c_attn.weight", golden[i].index, &golden[i].init);
        bool same = fabs(v - golden[i].want) <= 1e-15 * fabs(golden[i].want);
        ok(same, "golden value %zu (kind %d, element %llu)", i, (int)golden[i].init.kind,
           (unsigned long long)golden[i].index);
        if (!same)
            diag("got %a (%.17g), want %a", v, v, golden[i].want);
    }
}

static const uint64_t probe_index[] = {
    0, 1, 2, 3, 4294967294u, 4294967295u, 4294967296ULL, 4294967297ULL, 1ULL << 40, ~0ULL - 3, ~0ULL
};

/* Each distribution from the raw Philox words, for 2000 elements plus the
 * probes above (around the 32-bit boundary of the counter, and the very end). */
static void test_reference(void)
{
    const uint64_t seed = 7;
    const char *name = "h.1.ln_2.weight";
    uint32_t key[2];
    kern_init_key(seed, name, key);
    const bmt_init_t uni = BMT_INIT_UNIFORM_V(-3.0, 5.0), nor = BMT_INIT_NORMAL_V(0.5, 2.0),
                     tru = BMT_INIT_TRUNC_NORMAL_V(-1.0, 0.25);
    double err_u = 0, err_n = 0, err_t = 0;
    bool in_range = true, trunc_range = true;
    size_t nprobe = sizeof(probe_index) / sizeof(probe_index[0]);
    for (size_t j = 0; j < 2000 + nprobe; j++) {
        uint64_t idx = j < 2000 ? j * 2654435761ULL : probe_index[j - 2000];
        uint32_t ctr[4] = { (uint32_t)idx, (uint32_t)(idx >> 32), 0, 0 }, r[4];
        philox4x32_10(ctr, key, r);
        double ua = ref_u01(r[0], r[1]), ub = ref_u01(r[2], r[3]);

        double u = bmt_init_value(seed, name, idx, &uni);
        err_u = fmax(err_u, fabs(u - (-3.0 + 8.0 * ua)));
        in_range &= u >= -3.0 && u < 5.0;

        double n = bmt_init_value(seed, name, idx, &nor);
        double nref = 0.5 + 2.0 * sqrt(-2.0 * log(ua)) * cos(2.0 * M_PI * ub);
        err_n = fmax(err_n, fabs(n - nref) / (1.0 + fabs(nref)));

        double t = bmt_init_value(seed, name, idx, &tru);
        double z = (t + 1.0) / 0.25;
        trunc_range &= z >= -2.0 && z <= 2.0;
        double p = Phi(-2.0) + ua * (Phi(2.0) - Phi(-2.0));
        err_t = fmax(err_t, fabs(Phi(z) - p));
    }
    ok(err_u <= 1e-15 && in_range, "uniform(-3, 5) = a + (b - a) ua (max error %.3g)", err_u);
    ok(err_n <= 1e-14, "normal(0.5, 2) = a + b sqrt(-2 ln ua) cos(2 pi ub) (max rel error %.3g)",
       err_n);
    ok(trunc_range, "trunc normal(-1, 0.25) stays within a +- 2b");
    ok(err_t <= 4e-15,
       "trunc normal: Phi(z) = Phi(-2) + ua (Phi(2) - Phi(-2)) (max error %.3g in probability)",
       err_t);

    /* Constant kinds and scale. */
    bmt_init_t c;
    c = (bmt_init_t){ BMT_INIT_ZEROS, 3, 4, 2.5 };
    ok(bmt_init_value(seed, name, 5, &c) == 0.0, "zeros is 0");
    c = (bmt_init_t){ BMT_INIT_ONES, 3, 4, 0 };
    ok(bmt_init_value(seed, name, 5, &c) == 1.0, "ones is 1 (scale 0 means 1)");
    c = (bmt_init_t){ BMT_INIT_ONES, 3, 4, 2.5 };
    ok(bmt_init_value(seed, name, 5, &c) == 2.5, "ones with scale 2.5 is 2.5");
    c = (bmt_init_t){ BMT_INIT_CONSTANT, 0.375, 4, 1 };
    ok(bmt_init_value(seed, name, 5, &c) == 0.375, "constant a");
    bool scaled = true;
    for (uint64_t i = 0; i < 100; i++) {
        bmt_init_t s1 = BMT_INIT_NORMAL_V(0.5, 2.0), s0 = s1, s3 = s1;
        s0.scale = 0;
        s3.scale = 3;
        double v1 = bmt_init_value(seed, name, i, &s1);
        scaled &= d2u(bmt_init_value(seed, name, i, &s0)) == d2u(v1);
        scaled &= bmt_init_value(seed, name, i, &s3) == v1 * 3;
    }
    ok(scaled, "scale multiplies the value; scale 0 means 1");
    c = (bmt_init_t){ (bmt_init_kind_t)17, 0, 1, 1 };
    ok(isnan(bmt_init_value(seed, name, 0, &c)) && isnan(bmt_init_value(seed, NULL, 0, &nor)),
       "bmt_init_value: an unknown kind or no name gives NaN");
}

/* ------------------------------------------------------------ init: kernel */

static double rounded(double v, bmt_dtype_t t)
{
    switch (t) {
    case BMT_F32: return (float)v;
    case BMT_BF16: return bmt_bf16_to_f32(bmt_f32_to_bf16((float)v));
    default: return v;
    }
}

static double elem(const void *buf, bmt_dtype_t t, size_t i)
{
    switch (t) {
    case BMT_F32: return ((const float *)buf)[i];
    case BMT_BF16: return bmt_bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return ((const double *)buf)[i];
    }
}

static const bmt_dtype_t dtypes[] = { BMT_F32, BMT_BF16, BMT_F64 };

static void test_init_kernel(void)
{
    const uint64_t seed = 99;
    const char *name = "wpe.weight";
    uint32_t key[2];
    kern_init_key(seed, name, key);
    const bmt_init_t kinds[] = { BMT_INIT_UNIFORM_V(-0.1, 0.3),
                                 BMT_INIT_NORMAL_V(0.0, 0.02),
                                 BMT_INIT_TRUNC_NORMAL_V(0.01, 1.5),
                                 { BMT_INIT_CONSTANT, -0.3, 0, 2 } };
    const size_t n = 1000;
    const uint64_t first = 4294967296ULL - 400; /* crosses the counter's 32-bit word */
    void *buf = xmalloc(n * 8);
    bmt_error_t err = { { 0 } };
    for (size_t d = 0; d < 3; d++) {
        for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
            memset(buf, 0xff, n * 8);
            int rc = kern_init(ctx, NULL, buf, dtypes[d], n, first, key, &kinds[k], &err);
            bool same = rc == 0;
            for (size_t i = 0; i < n && same; i++) {
                double want = rounded(bmt_init_value(seed, name, first + i, &kinds[k]), dtypes[d]);
                same = d2u(elem(buf, dtypes[d], i)) == d2u(want);
            }
            ok(same, "kern_init %s kind %d = bmt_init_value rounded to %s, bit for bit",
               bmt_dtype_name(dtypes[d]), (int)kinds[k].kind, bmt_dtype_name(dtypes[d]));
        }
    }
    free(buf);

    bmt_init_t bad = { (bmt_init_kind_t)9, 0, 1, 1 };
    float f[4] = { 1, 2, 3, 4 };
    int rc = kern_init(ctx, NULL, f, BMT_F32, 4, 0, key, &bad, &err);
    ok(rc == -1 && strstr(err.text, "kern_init") && strstr(err.text, "rank 0") && f[0] == 1,
       "kern_init: unknown kind is an error that writes nothing (%s)", err.text);
    rc = kern_init(ctx, NULL, f, (bmt_dtype_t)7, 4, 0, key, &kinds[0], &err);
    ok(rc == -1 && strstr(err.text, "dtype") && f[0] == 1, "kern_init: invalid dtype (%s)",
       err.text);
    rc = kern_init(ctx, NULL, f, BMT_F32, 4, ~0ULL - 2, key, &kinds[0], &err);
    ok(rc == -1 && f[0] == 1, "kern_init: indices past 2^64 - 1 are an error (%s)", err.text);
}

/* Filling [0, N) whole equals filling it in pieces at arbitrary offsets, in any
 * order: the layout-invariance the sharded blocks rely on. */
static void test_layout_invariance(void)
{
    const size_t N = 100003;
    const uint64_t base = 123456789; /* the parameter's offset in some flat buffer */
    uint32_t key[2];
    kern_init_key(2024, "h.11.attn.c_proj.weight", key);
    const bmt_init_t kinds[] = { BMT_INIT_UNIFORM_V(-1, 1), BMT_INIT_NORMAL_V(0, 1),
                                 BMT_INIT_TRUNC_NORMAL_V(0, 1) };
    const int pieces[] = { 1, 3, 7 };
    void *whole = xmalloc(N * 4), *again = xmalloc(N * 4), *parts = xmalloc(N * 4);
    bmt_error_t err;
    bool determinism = true;
    for (size_t k = 0; k < 3; k++) {
        for (size_t d = 0; d < 2; d++) {
            bmt_dtype_t t = dtypes[d];
            size_t es = bmt_dtype_size(t);
            kern_init(ctx, NULL, whole, t, N, base, key, &kinds[k], &err);
            memset(again, 0xff, N * es);
            kern_init(ctx, NULL, again, t, N, base, key, &kinds[k], &err);
            determinism &= memcmp(whole, again, N * es) == 0;
            for (size_t pi = 0; pi < 3; pi++) {
                int np = pieces[pi];
                size_t cut[8];
                cut[0] = 0;
                cut[np] = N;
                for (int c = 1; c < np; c++) /* random cuts, sorted by insertion */
                {
                    size_t x = (size_t)(rnd64() % N), j = (size_t)c;
                    while (j > 1 && cut[j - 1] > x) {
                        cut[j] = cut[j - 1];
                        j--;
                    }
                    cut[j] = x;
                }
                memset(parts, 0xff, N * es);
                int rc = 0;
                for (int c = np - 1; c >= 0; c--) /* last piece first */
                    rc |= kern_init(ctx, NULL, (char *)parts + cut[c] * es, t, cut[c + 1] - cut[c],
                                    base + cut[c], key, &kinds[k], &err);
                ok(rc == 0 && memcmp(whole, parts, N * es) == 0,
                   "kind %d %s: [0, %zu) whole = in %d pieces, bit for bit", (int)kinds[k].kind,
                   bmt_dtype_name(t), N, np);
            }
        }
    }
    ok(determinism, "kern_init gives the same bits on every call");
    free(whole);
    free(again);
    free(parts);
}

/* ------------------------------------------------------------ init: statistics */

/* Chi-square over 20 bins of equal probability under cdf (with parameters prm). */
static double chi_square(const double *x, size_t n, double (*cdf)(double, const double *),
                         const double *prm)
{
    size_t count[20] = { 0 };
    for (size_t i = 0; i < n; i++) {
        double p = cdf(x[i], prm);
        int b = (int)(p * 20.0);
        if (b < 0)
            b = 0;
        if (b > 19)
            b = 19;
        count[b]++;
    }
    double chi = 0, e = (double)n / 20.0;
    for (int b = 0; b < 20; b++)
        chi += ((double)count[b] - e) * ((double)count[b] - e) / e;
    return chi;
}

static double cdf_uniform(double x, const double *p) { return (x - p[0]) / (p[1] - p[0]); }
static double cdf_normal(double x, const double *p) { return Phi((x - p[0]) / p[1]); }
static double cdf_trunc(double x, const double *p)
{
    return (Phi((x - p[0]) / p[1]) - Phi(-2.0)) / (Phi(2.0) - Phi(-2.0));
}

typedef struct {
    double mean, sd, min, max, kurt;
} moments_t;

static moments_t moments(const double *x, size_t n)
{
    moments_t m = { 0, 0, INFINITY, -INFINITY, 0 };
    for (size_t i = 0; i < n; i++) {
        m.mean += x[i];
        m.min = fmin(m.min, x[i]);
        m.max = fmax(m.max, x[i]);
    }
    m.mean /= (double)n;
    double m2 = 0, m4 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - m.mean;
        m2 += d * d;
        m4 += d * d * d * d;
    }
    m2 /= (double)n;
    m4 /= (double)n;
    m.sd = sqrt(m2);
    m.kurt = m4 / (m2 * m2);
    return m;
}

static void test_statistics(void)
{
    const size_t n = 1000000;
    const double sn = sqrt((double)n);
    const double chi_max = 60.0; /* 19 degrees of freedom: P(chi2 > 60) ~ 3e-6 */
    double *x = xmalloc(n * sizeof(double));
    uint32_t key[2];
    bmt_error_t err;

    /* Uniform(a, b): mean (a+b)/2, sd (b-a)/sqrt 12, kurtosis 1.8. */
    kern_init_key(5, "stats.uniform", key);
    bmt_init_t u = BMT_INIT_UNIFORM_V(-0.5, 1.5);
    ok(kern_init(ctx, NULL, x, BMT_F64, n, 0, key, &u, &err) == 0, "uniform: 1e6 samples");
    moments_t m = moments(x, n);
    double sd = 2.0 / sqrt(12.0);
    ok(fabs(m.mean - 0.5) < 5 * sd / sn, "uniform: mean %.6f (want 0.5 +- %.1e)", m.mean,
       5 * sd / sn);
    ok(fabs(m.sd / sd - 1) < 5 * sqrt(0.8 / (double)n) / 2,
       "uniform: sd %.6f (want %.6f, relative +- %.1e)", m.sd, sd, 5 * sqrt(0.8 / (double)n) / 2);
    ok(m.min >= -0.5 && m.max < 1.5 && m.min < -0.5 + 2e-5 && m.max > 1.5 - 2e-5,
       "uniform: min %.8f, max %.8f inside [a, b) and near both ends", m.min, m.max);
    double c = chi_square(x, n, cdf_uniform, (const double[]){ -0.5, 1.5 });
    ok(c < chi_max, "uniform: chi-square over 20 bins %.1f", c);

    /* Normal(a, b): 31.73% beyond one sd, 0.27% beyond three, kurtosis 3. */
    kern_init_key(5, "stats.normal", key);
    bmt_init_t nr = BMT_INIT_NORMAL_V(0.25, 2.0);
    ok(kern_init(ctx, NULL, x, BMT_F64, n, 0, key, &nr, &err) == 0, "normal: 1e6 samples");
    m = moments(x, n);
    ok(fabs(m.mean - 0.25) < 5 * 2.0 / sn, "normal: mean %.5f (want 0.25 +- %.1e)", m.mean,
       10.0 / sn);
    ok(fabs(m.sd / 2.0 - 1) < 5 * sqrt(0.5 / (double)n), "normal: sd %.5f (want 2)", m.sd);
    ok(fabs(m.kurt - 3) < 5 * sqrt(24.0 / (double)n), "normal: kurtosis %.4f (want 3)", m.kurt);
    size_t out1 = 0, out3 = 0;
    for (size_t i = 0; i < n; i++) {
        double z = fabs(x[i] - 0.25) / 2.0;
        out1 += z > 1;
        out3 += z > 3;
    }
    double f1 = (double)out1 / (double)n, p1 = erfc(1 / sqrt(2.0));
    double f3 = (double)out3 / (double)n, p3 = erfc(3 / sqrt(2.0));
    ok(fabs(f1 - p1) < 5 * sqrt(p1 * (1 - p1) / (double)n),
       "normal: fraction beyond 1 sd %.5f (want %.5f)", f1, p1);
    ok(fabs(f3 - p3) < 5 * sqrt(p3 * (1 - p3) / (double)n),
       "normal: fraction beyond 3 sd %.5f (want %.5f)", f3, p3);
    c = chi_square(x, n, cdf_normal, (const double[]){ 0.25, 2.0 });
    ok(c < chi_max, "normal: chi-square over 20 bins %.1f", c);

    /* Truncated normal(a, b) cut at +-2b: sd b sqrt(1 - 4 phi(2) / (Phi(2) - Phi(-2))). */
    kern_init_key(5, "stats.trunc", key);
    bmt_init_t tn = BMT_INIT_TRUNC_NORMAL_V(1.0, 0.5);
    ok(kern_init(ctx, NULL, x, BMT_F64, n, 0, key, &tn, &err) == 0, "trunc normal: 1e6 samples");
    m = moments(x, n);
    double mass = Phi(2) - Phi(-2), phi2 = exp(-2.0) / sqrt(2 * M_PI);
    double tsd = 0.5 * sqrt(1 - 4 * phi2 / mass);
    ok(fabs(m.mean - 1.0) < 5 * tsd / sn, "trunc normal: mean %.5f (want 1)", m.mean);
    ok(fabs(m.sd / tsd - 1) < 5 * sqrt(0.5 / (double)n), "trunc normal: sd %.5f (want %.5f)", m.sd,
       tsd);
    ok(m.min >= 0.0 && m.max <= 2.0 && m.min < 0.0 + 5e-4 && m.max > 2.0 - 5e-4,
       "trunc normal: min %.6f, max %.6f within a +- 2b and reaching both cuts", m.min, m.max);
    size_t beyond = 0;
    for (size_t i = 0; i < n; i++)
        beyond += fabs(x[i] - 1.0) > 0.5;
    double fb = (double)beyond / (double)n, pb = 2 * (Phi(2) - Phi(1)) / mass;
    ok(fabs(fb - pb) < 5 * sqrt(pb * (1 - pb) / (double)n),
       "trunc normal: fraction beyond 1 b %.5f (want %.5f)", fb, pb);
    c = chi_square(x, n, cdf_trunc, (const double[]){ 1.0, 0.5 });
    ok(c < chi_max, "trunc normal: chi-square over 20 bins %.1f", c);
    free(x);
}

/* Names and seeds select unrelated streams. */
static void test_streams(void)
{
    const size_t n = 10000;
    const struct {
        uint64_t seed;
        const char *name;
    } s[] = { { 1, "h.0.attn.weight" },
              { 1, "h.1.attn.weight" },
              { 2, "h.0.attn.weight" },
              { 1, "h.0.attn.bias" },
              { 0, "h.0.attn.weight" } };
    const size_t ns = sizeof(s) / sizeof(s[0]);
    double *x = xmalloc(ns * n * sizeof(double));
    bmt_init_t nr = BMT_INIT_NORMAL_V(0, 1);
    for (size_t k = 0; k < ns; k++)
        for (size_t i = 0; i < n; i++)
            x[k * n + i] = bmt_init_value(s[k].seed, s[k].name, i, &nr);
    for (size_t k = 1; k < ns; k++) {
        size_t equal = 0;
        double sxy = 0, sxx = 0, syy = 0;
        for (size_t i = 0; i < n; i++) {
            double a = x[i], b = x[k * n + i];
            equal += a == b;
            sxy += a * b;
            sxx += a * a;
            syy += b * b;
        }
        double r = sxy / sqrt(sxx * syy);
        ok(equal == 0 && fabs(r) < 5 / sqrt((double)n),
           "seed %llu '%s' vs seed 1 '%s': no equal values, correlation %.4f",
           (unsigned long long)s[k].seed, s[k].name, s[0].name, r);
    }
    bool same = true;
    for (size_t i = 0; i < n; i++)
        same &= d2u(bmt_init_value(1, "h.0.attn.weight", i, &nr)) == d2u(x[i]);
    ok(same, "the same seed and name give the same values");
    free(x);
}

/* ------------------------------------------------------------ zero, cast, accumulate */

static void test_zero(void)
{
    unsigned char b[1003];
    memset(b, 0xab, sizeof(b));
    bmt_error_t err;
    int rc = kern_zero(ctx, NULL, b + 1, 1000, &err);
    bool good = rc == 0 && b[0] == 0xab && b[1001] == 0xab && b[1002] == 0xab;
    for (int i = 1; i <= 1000; i++)
        good &= b[i] == 0;
    ok(good, "kern_zero clears exactly its bytes");
    ok(kern_zero(ctx, NULL, NULL, 0, &err) == 0, "kern_zero of 0 bytes is a no-op");
    /* kern_fill 0xff: every f32 a NaN (BMT_CHECK_OVERWRITE's poison) */
    float f[7] = { 1, 2, 3, 4, 5, 6, 7 };
    rc = kern_fill(ctx, NULL, f + 1, 0xff, 5 * sizeof(float), &err);
    good = rc == 0 && f[0] == 1 && f[6] == 7;
    for (int i = 1; i <= 5; i++)
        good &= isnan(f[i]);
    ok(good, "kern_fill 0xff makes exactly its floats NaN");
    ok(kern_fill(ctx, NULL, NULL, 0xff, 4, &err) == -1 && strstr(err.text, "kern_fill") &&
           strstr(err.text, "NULL"),
       "kern_fill into NULL: an error (%s)", err.text);
}

/* Round to nearest even into bf16, from the definition: the two bf16 neighbours
 * of x (truncation toward zero and the next one up in magnitude; past the
 * largest finite one, 2^128 stands for infinity) and the nearer wins, the one
 * with an even last bit on a tie. NaN: a NaN of the same sign. */
static uint16_t ref_bf16(float x)
{
    uint32_t u = f2u(x);
    if (isnan(x))
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u); /* checked by class only */
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    double dx = fabs((double)x), dlo = fabs((double)u2f(lo));
    double dhi = (hi & 0x7fffffffu) == 0x7f800000u ? ldexp(1.0, 128) : fabs((double)u2f(hi));
    if (isinf(x))
        return (uint16_t)(u >> 16);
    double a = dx - dlo, b = dhi - dx;
    if (a < b || (a == b && ((lo >> 16) & 1u) == 0))
        return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

static void test_cast(void)
{
    bmt_error_t err;
    static const struct {
        uint32_t in;
        uint16_t want;
        const char *what;
    } table[] = {
        { 0x3f800000, 0x3f80, "1.0 exact" },
        { 0x3f808000, 0x3f80, "1 + 2^-8: tie, down to even" },
        { 0x3f818000, 0x3f82, "1 + 3 2^-8: tie, up to even" },
        { 0x3f808001, 0x3f81, "just above a tie: up" },
        { 0x3f807fff, 0x3f80, "just below a tie: down" },
        { 0xbf808000, 0xbf80, "-(1 + 2^-8): tie, to even" },
        { 0xbf818000, 0xbf82, "-(1 + 3 2^-8): tie, to even" },
        { 0x7f7fffff, 0x7f80, "FLT_MAX rounds to inf" },
        { 0x7f7f7fff, 0x7f7f, "below the overflow tie: largest finite" },
        { 0x7f7f8000, 0x7f80, "the overflow tie goes to even: inf" },
        { 0x7f800000, 0x7f80, "inf" },
        { 0xff800000, 0xff80, "-inf" },
        { 0x7fc00000, 0x7fc0, "quiet NaN" },
        { 0x7f800001, 0x7fc0, "NaN with a low payload stays NaN (not inf)" },
        { 0xff800001, 0xffc0, "negative NaN with a low payload" },
        { 0xffffffff, 0xffff, "all-ones NaN" },
        { 0x7f810000, 0x7fc1, "signalling NaN: quieted, payload kept" },
        { 0x00000000, 0x0000, "+0" },
        { 0x80000000, 0x8000, "-0" },
        { 0x00008000, 0x0000, "subnormal tie: to even (0)" },
        { 0x00018000, 0x0002, "subnormal tie: to even (2)" },
        { 0x00000001, 0x0000, "smallest subnormal: 0" },
        { 0x807fffff, 0x8080, "largest negative subnormal rounds to -FLT_MIN" },
    };
    size_t nt = sizeof(table) / sizeof(table[0]);
    float in[32];
    uint16_t out[32];
    for (size_t i = 0; i < nt; i++)
        in[i] = u2f(table[i].in);
    memset(out, 0x55, sizeof(out));
    int rc = kern_cast(ctx, NULL, out, BMT_BF16, in, BMT_F32, nt, &err);
    for (size_t i = 0; i < nt; i++) {
        bool good =
            rc == 0 && out[i] == table[i].want &&
            (isnan(in[i]) ? bf16_is_nan(ref_bf16(in[i])) : ref_bf16(in[i]) == table[i].want);
        ok(good, "f32 -> bf16 %08x: %s", table[i].in, table[i].what);
        if (!good)
            diag("got %04x, reference %04x, want %04x", out[i], ref_bf16(in[i]), table[i].want);
    }

    /* Random bit patterns (a quarter of them made ties) against the reference. */
    const size_t n = 200000;
    float *f = xmalloc(n * 4);
    uint16_t *h = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)rnd64();
        if (i % 4 == 0)
            u = (u & 0xffff0000u) | 0x8000u;
        f[i] = u2f(u);
    }
    rc = kern_cast(ctx, NULL, h, BMT_BF16, f, BMT_F32, n, &err);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = ref_bf16(f[i]);
        bad +=
            isnan(f[i]) ? !(bf16_is_nan(h[i]) && (h[i] >> 15) == (f2u(f[i]) >> 31)) : h[i] != want;
    }
    ok(rc == 0 && bad == 0,
       "f32 -> bf16 of %zu random patterns (ties, NaN, inf, subnormal): %zu wrong", n, bad);

    /* Every bf16 back to f32: the upper half of the f32. */
    uint16_t *all = xmalloc(65536 * 2);
    float *back = xmalloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    memset(back, 0, 65536 * 4);
    rc = kern_cast(ctx, NULL, back, BMT_F32, all, BMT_BF16, 65536, &err);
    bad = 0;
    for (uint32_t i = 0; i < 65536; i++)
        bad += f2u(back[i]) != i << 16;
    ok(rc == 0 && bad == 0,
       "bf16 -> f32 of all 65536 patterns is exact, signalling NaNs included (%zu wrong)", bad);

    /* Copies and f64. */
    const size_t m = 1001;
    double *d = xmalloc(m * 8), *d2 = xmalloc(m * 8);
    float *g = xmalloc(m * 4), *g2 = xmalloc(m * 4);
    uint16_t *b = xmalloc(m * 2), *b2 = xmalloc(m * 2);
    for (size_t i = 0; i < m; i++)
        d[i] = (rnd_unit() * 2 - 1) * ldexp(1.0, (int)(rnd64() % 40) - 20);
    bool good = kern_cast(ctx, NULL, g, BMT_F32, d, BMT_F64, m, &err) == 0;
    for (size_t i = 0; i < m; i++)
        good &= f2u(g[i]) == f2u((float)d[i]);
    ok(good, "f64 -> f32 rounds to nearest");
    good = kern_cast(ctx, NULL, b, BMT_BF16, d, BMT_F64, m, &err) == 0;
    for (size_t i = 0; i < m; i++)
        good &= b[i] == ref_bf16((float)d[i]);
    ok(good, "f64 -> bf16 rounds through f32");
    good = kern_cast(ctx, NULL, d2, BMT_F64, g, BMT_F32, m, &err) == 0;
    for (size_t i = 0; i < m; i++)
        good &= d2[i] == (double)g[i];
    ok(good, "f32 -> f64 is exact");
    good = kern_cast(ctx, NULL, d2, BMT_F64, b, BMT_BF16, m, &err) == 0;
    for (size_t i = 0; i < m; i++)
        good &= d2[i] == (double)u2f((uint32_t)b[i] << 16);
    ok(good, "bf16 -> f64 is exact");
    good = kern_cast(ctx, NULL, g2, BMT_F32, g, BMT_F32, m, &err) == 0 &&
           kern_cast(ctx, NULL, b2, BMT_BF16, b, BMT_BF16, m, &err) == 0 &&
           memcmp(g, g2, m * 4) == 0 && memcmp(b, b2, m * 2) == 0;
    ok(good, "f32 -> f32 and bf16 -> bf16 copy");

    memcpy(g2, g, m * 4);
    ctx->rank = 5;
    rc = kern_cast(ctx, NULL, g, BMT_F32, b, (bmt_dtype_t)3, m, &err);
    ctx->rank = 0;
    ok(rc == -1 && strstr(err.text, "rank 5") && strstr(err.text, "kern_cast") &&
           memcmp(g, g2, m * 4) == 0,
       "kern_cast: an invalid dtype is an error naming the kernel and the rank (%s)", err.text);
    free(f);
    free(h);
    free(all);
    free(back);
    free(d);
    free(d2);
    free(g);
    free(g2);
    free(b);
    free(b2);
}

static void test_accumulate(void)
{
    const size_t n = 100001;
    float *dst = xmalloc(n * 4), *src = xmalloc(n * 4), *want = xmalloc(n * 4);
    uint16_t *hb = xmalloc(n * 2);
    bmt_error_t err;
    for (size_t i = 0; i < n; i++) {
        dst[i] = rnd_float(10, 10);
        src[i] = rnd_float(12, 8);
        want[i] = (float)((double)dst[i] + (double)src[i]); /* innocuous double rounding */
    }
    int rc = kern_accumulate(ctx, NULL, dst, src, BMT_F32, n, &err);
    ok(rc == 0 && memcmp(dst, want, n * 4) == 0, "accumulate f32 += f32 (f32 addition)");
    for (size_t i = 0; i < n; i++) {
        hb[i] = (uint16_t)(f2u(rnd_float(12, 8)) >> 16);
        /* bf16 value from its fields, not from the f32 bit trick */
        int e = (hb[i] >> 7) & 0xff;
        double mant = (double)(hb[i] & 0x7f) / 128.0;
        double v = e ? ldexp(1.0 + mant, e - 127) : ldexp(mant, -126);
        if (hb[i] & 0x8000)
            v = -v;
        want[i] = (float)((double)dst[i] + v);
    }
    rc = kern_accumulate(ctx, NULL, dst, hb, BMT_BF16, n, &err);
    ok(rc == 0 && memcmp(dst, want, n * 4) == 0, "accumulate f32 += bf16");
    memcpy(want, dst, n * 4);
    rc = kern_accumulate(ctx, NULL, dst, src, BMT_F64, n, &err);
    ok(rc == -1 && strstr(err.text, "kern_accumulate") && memcmp(dst, want, n * 4) == 0,
       "accumulate from f64 is an error (%s)", err.text);
    free(dst);
    free(src);
    free(want);
    free(hb);
}

/* ------------------------------------------------------------ sumsq */

static void test_sumsq(void)
{
    const size_t n = 1000003;
    float *x = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++)
        x[i] = rnd_float(20, 20);
    /* Neumaier's compensated sum: error about one rounding of the total. */
    double s = 0, comp = 0;
    for (size_t i = 0; i < n; i++) {
        double t = (double)x[i] * x[i], u = s + t;
        comp += fabs(s) >= fabs(t) ? (s - u) + t : (t - u) + s;
        s = u;
    }
    double want = s + comp;
    double out[4] = { -1, -1, -1, -1 };
    bmt_error_t err;
    int rc = kern_sumsq(ctx, NULL, x, n, out, 2, &err);
    double rel = fabs(out[2] - want) / want;
    ok(rc == 0 && rel < 1e-12, "sumsq of 1e6 floats within 1e-12 of a compensated sum (%.2g)", rel);
    ok(out[0] == -1 && out[1] == -1 && out[3] == -1, "sumsq writes only out[slot]");
    double again[4];
    kern_sumsq(ctx, NULL, x, n, again, 0, &err);
    ok(d2u(again[0]) == d2u(out[2]), "sumsq gives the same bits on every call");
    x[77] = NAN;
    kern_sumsq(ctx, NULL, x, n, out, 1, &err);
    ok(isnan(out[1]), "sumsq: a NaN element gives NaN");
    x[77] = -INFINITY;
    kern_sumsq(ctx, NULL, x, n, out, 1, &err);
    ok(isinf(out[1]) && out[1] > 0, "sumsq: an infinite element gives +inf");
    x[78] = NAN;
    kern_sumsq(ctx, NULL, x, n, out, 1, &err);
    ok(isnan(out[1]), "sumsq: inf and NaN give NaN");
    out[0] = -1;
    ok(kern_sumsq(ctx, NULL, x, 0, out, 0, &err) == 0 && out[0] == 0.0, "sumsq of nothing is 0");
    ok(kern_sumsq(ctx, NULL, x, n, out, -1, &err) == -1 && strstr(err.text, "kern_sumsq"),
       "sumsq: a negative slot is an error (%s)", err.text);
    free(x);
}

/* ------------------------------------------------------------ adamw */

typedef struct {
    float lr, beta1, beta2, eps, wd, grad_scale;
} hyper_t;

enum {
    ADAMW_STEPS = 10
};

/* torch.optim.AdamW (single-tensor), in double: decay first, then the moments,
 * then p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). */
static void ref_adamw(double *p, double *m, double *v, const float *grads, size_t n,
                      const hyper_t *h, int steps)
{
    for (int t = 1; t <= steps; t++) {
        double bc1 = 1 - pow(h->beta1, t), bc2 = 1 - pow(h->beta2, t);
        for (size_t i = 0; i < n; i++) {
            double g = (double)grads[(size_t)(t - 1) * n + i] * h->grad_scale;
            p[i] *= 1 - (double)h->lr * h->wd;
            m[i] = h->beta1 * m[i] + (1 - (double)h->beta1) * g;
            v[i] = h->beta2 * v[i] + (1 - (double)h->beta2) * g * g;
            p[i] -= h->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + h->eps);
        }
    }
}

/* Run our kernel for steps; param: NULL (param == master), or f32 / bf16 out. */
static int run_adamw(float *master, float *m, float *v, const float *grads, void *param,
                     bmt_dtype_t pt, size_t n, const hyper_t *h, int steps, bool *param_ok)
{
    bmt_error_t err;
    *param_ok = true;
    for (int t = 1; t <= steps; t++) {
        kern_adamw_args_t a = { h->lr,
                                h->beta1,
                                h->beta2,
                                h->eps,
                                h->wd,
                                h->grad_scale,
                                (float)(1 - pow(h->beta1, t)),
                                (float)(1 - pow(h->beta2, t)),
                                (float)(1.0 - h->beta1),
                                (float)(1.0 - h->beta2) };
        void *pp = param ? param : master;
        if (kern_adamw(ctx, NULL, master, m, v, grads + (size_t)(t - 1) * n, pp, pt, n, &a, &err) !=
            0) {
            diag("kern_adamw: %s", err.text);
            return -1;
        }
        for (size_t i = 0; param && i < n; i++)
            *param_ok &= pt == BMT_F32 ? f2u(((float *)param)[i]) == f2u(master[i])
                                       : ((uint16_t *)param)[i] == bmt_f32_to_bf16(master[i]);
    }
    return 0;
}

static void adamw_compare(const char *what, const float *master, const float *m, const float *v,
                          const double *rp, const double *rm, const double *rv, size_t n)
{
    double ep = 0, em = 0, ev = 0;
    for (size_t i = 0; i < n; i++) {
        ep = fmax(ep, fabs(master[i] - rp[i]) / fmax(1.0, fabs(rp[i])));
        em = fmax(em, fabs(m[i] - rm[i])); /* m is O(grad): absolute */
        ev = fmax(ev, fabs(v[i] - rv[i]) / fmax(rv[i], 1e-30));
    }
    ok(ep < 2e-6 && em < 1e-6 && ev < 1e-5,
       "adamw %s: 10 steps vs double reference (param %.2g rel, m %.2g, v %.2g rel)", what, ep, em,
       ev);
}

/* torch.optim.AdamW on the same data, through /usr/bin/python3 if it has torch. */
static void adamw_torch(const float *p0, const float *grads, size_t n, const hyper_t *h,
                        const float *ours)
{
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        diag("skipped: adamw vs torch.optim.AdamW (/usr/bin/python3 cannot import torch)");
        return;
    }
    char in[] = "/tmp/bmt-adamw-in.XXXXXX", out[] = "/tmp/bmt-adamw-out.XXXXXX";
    int fi = mkstemp(in), fo = mkstemp(out);
    if (fi < 0 || fo < 0) {
        ok(0, "adamw vs torch: temporary files");
        return;
    }
    close(fo);
    FILE *f = fdopen(fi, "wb");
    int32_t hdr[2] = { (int32_t)n, ADAMW_STEPS };
    float hp[6] = { h->lr, h->beta1, h->beta2, h->eps, h->wd, h->grad_scale };
    fwrite(hdr, sizeof(hdr), 1, f);
    fwrite(hp, sizeof(hp), 1, f);
    fwrite(p0, 4, n, f);
    fwrite(grads, 4, n * ADAMW_STEPS, f);
    fclose(f);
    static const char script[] =
        "import struct, sys, torch\n"
        "d = open(sys.argv[1], 'rb').read()\n"
        "n, steps = struct.unpack_from('<2i', d, 0)\n"
        "lr, b1, b2, eps, wd, gs = struct.unpack_from('<6f', d, 8)\n"
        "def arr(k):\n"
        "    return torch.tensor(struct.unpack_from('<%df' % n, d, 32 + 4 * n * k),\n"
        "                        dtype=torch.float32)\n"
        "p = torch.nn.Parameter(arr(0))\n"
        "opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)\n"
        "for s in range(steps):\n"
        "    p.grad = arr(1 + s) * gs\n"
        "    opt.step()\n"
        "open(sys.argv[2], 'wb').write(struct.pack('<%df' % n, *p.detach().tolist()))\n";
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 - %s %s", in, out);
    FILE *py = popen(cmd, "w");
    int rc = -1;
    if (py) {
        fputs(script, py);
        rc = pclose(py);
    }
    float *tp = xmalloc(n * 4);
    f = fopen(out, "rb");
    size_t got = f ? fread(tp, 4, n, f) : 0;
    if (f)
        fclose(f);
    unlink(in);
    unlink(out);
    double e = 0;
    size_t same = 0;
    for (size_t i = 0; i < got; i++) {
        e = fmax(e, fabs(ours[i] - tp[i]) / fmax(1.0, fabs(tp[i])));
        same += f2u(ours[i]) == f2u(tp[i]);
    }
    ok(rc == 0 && got == n && e < 1e-6,
       "adamw vs torch.optim.AdamW, 10 steps: max rel difference %.2g (%zu of %zu bit for bit)", e,
       same, n);
    free(tp);
}

static void test_adamw(void)
{
    const size_t n = 4099; /* not a multiple of 4 */
    hyper_t h = { 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f };
    float *p0 = xmalloc(n * 4), *grads = xmalloc(n * ADAMW_STEPS * 4);
    for (size_t i = 0; i < n; i++)
        p0[i] = (float)(rnd_unit() * 4 - 2);
    for (size_t i = 0; i < n * ADAMW_STEPS; i++)
        grads[i] = rnd_float(6, 3);
    double *rp = xmalloc(n * 8), *rm = xmalloc(n * 8), *rv = xmalloc(n * 8);
    float *master = xmalloc(n * 4), *m = xmalloc(n * 4), *v = xmalloc(n * 4);
    float *pf = xmalloc(n * 4), *keep = xmalloc(n * 4), *km = xmalloc(n * 4), *kv = xmalloc(n * 4);
    uint16_t *pb = xmalloc(n * 2);

    hyper_t cases[2] = { h, h };
    cases[1].wd = 0;
    cases[1].grad_scale = 1;
    for (int c = 0; c < 2; c++) {
        const hyper_t *hc = &cases[c];
        for (size_t i = 0; i < n; i++) {
            rp[i] = p0[i];
            rm[i] = rv[i] = 0;
        }
        ref_adamw(rp, rm, rv, grads, n, hc, ADAMW_STEPS);
        char what[64];

        /* f32 parameter separate from the master */
        memcpy(master, p0, n * 4);
        memset(m, 0, n * 4);
        memset(v, 0, n * 4);
        memset(pf, 0xff, n * 4);
        bool param_ok;
        int rc = run_adamw(master, m, v, grads, pf, BMT_F32, n, hc, ADAMW_STEPS, &param_ok);
        snprintf(what, sizeof(what), "(wd %g, grad scale %g, f32 param)", (double)hc->wd,
                 (double)hc->grad_scale);
        adamw_compare(what, master, m, v, rp, rm, rv, n);
        ok(rc == 0 && param_ok, "adamw %s: param = master, bit for bit, after every step", what);
        memcpy(keep, master, n * 4);
        memcpy(km, m, n * 4);
        memcpy(kv, v, n * 4);
        if (c == 0)
            adamw_torch(p0, grads, n, hc, master);

        /* param == master */
        memcpy(master, p0, n * 4);
        memset(m, 0, n * 4);
        memset(v, 0, n * 4);
        rc = run_adamw(master, m, v, grads, NULL, BMT_F32, n, hc, ADAMW_STEPS, &param_ok);
        snprintf(what, sizeof(what), "(wd %g, param == master)", (double)hc->wd);
        ok(rc == 0 && memcmp(master, keep, n * 4) == 0 && memcmp(m, km, n * 4) == 0 &&
               memcmp(v, kv, n * 4) == 0,
           "adamw %s: the same bits as with a separate param", what);

        /* bf16 parameter */
        memcpy(master, p0, n * 4);
        memset(m, 0, n * 4);
        memset(v, 0, n * 4);
        memset(pb, 0xff, n * 2);
        rc = run_adamw(master, m, v, grads, pb, BMT_BF16, n, hc, ADAMW_STEPS, &param_ok);
        snprintf(what, sizeof(what), "(wd %g, bf16 param)", (double)hc->wd);
        ok(rc == 0 && param_ok && memcmp(master, keep, n * 4) == 0,
           "adamw %s: master as with f32, param its bf16 rounding after every step", what);
    }

    /* Errors change nothing. */
    kern_adamw_args_t a = { 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 0.1f, 0.001f, 0.1f, 0.001f };
    bmt_error_t err;
    memcpy(keep, master, n * 4);
    int rc = kern_adamw(ctx, NULL, master, m, v, grads, master, BMT_BF16, n, &a, &err);
    ok(rc == -1 && strstr(err.text, "kern_adamw") && memcmp(master, keep, n * 4) == 0,
       "adamw: param == master with a bf16 dtype is an error (%s)", err.text);
    rc = kern_adamw(ctx, NULL, master, m, v, grads, pf, BMT_F64, n, &a, &err);
    ok(rc == -1 && memcmp(master, keep, n * 4) == 0, "adamw: an f64 param is an error (%s)",
       err.text);
    a.bc1 = 0;
    rc = kern_adamw(ctx, NULL, master, m, v, grads, pf, BMT_F32, n, &a, &err);
    ok(rc == -1 && memcmp(master, keep, n * 4) == 0, "adamw: bc1 = 0 is an error (%s)", err.text);

    free(p0);
    free(grads);
    free(rp);
    free(rm);
    free(rv);
    free(master);
    free(m);
    free(v);
    free(pf);
    free(keep);
    free(km);
    free(kv);
    free(pb);
}

/* ------------------------------------------------------------ contexts */

static void test_context_errors(void)
{
    bmt_error_t err;
    float x[4] = { 0 };
    double out;
    ok(kern_sumsq(NULL, NULL, x, 4, &out, 0, &err) == -1, "no context: an error (%s)", err.text);
    ctx->device = (bmt_device_kind_t)7;
    ok(kern_zero(ctx, NULL, x, 16, &err) == -1 && strstr(err.text, "kern_zero") &&
           strstr(err.text, "device"),
       "an unknown device kind: an error (%s)", err.text);
    ctx->device = BMT_DEVICE_CPU;
#ifndef BMT_HAVE_CUDA
    ctx->device = BMT_DEVICE_CUDA;
    ok(kern_zero(ctx, NULL, x, 16, &err) == -1 && strstr(err.text, "without CUDA"),
       "a cuda context in a build without CUDA: an error (%s)", err.text);
    ctx->device = BMT_DEVICE_CPU;
#endif
}

/* ------------------------------------------------------------ split master */

/* hi of a split master from its definition: the bf16 neighbours of x toward
 * and away from zero, the nearer in exact (double) arithmetic, a tie going away
 * from zero; past bf16's largest finite value the neighbour away is 2^128 (inf). */
static uint16_t ref_split_hi(float x)
{
    const uint32_t u = f2u(x);
    const uint16_t down = (uint16_t)(u >> 16), up = (uint16_t)(down + 1);
    if ((u & 0xffffu) == 0)
        return down;
    const double dx = fabs((double)x), a = fabs((double)bmt_bf16_to_f32(down));
    const double b =
        (up & 0x7fffu) == 0x7f80u ? ldexp(1.0, 128) : fabs((double)bmt_bf16_to_f32(up));
    return dx - a < b - dx ? down : up;
}

static void test_split_master(void)
{
    /* Every f32 pattern: joined back bit for bit (NaN: a NaN), and hi the
     * nearest bf16, ties away from zero, from the definition on the patterns
     * that decide it (ties and their neighbours, of every upper half) and on
     * a sample of the rest. */
    size_t bad_join = 0, bad_nan = 0, bad_hi = 0, checked_hi = 0, seen = 0, nans = 0;
    for (uint64_t k = 0; k <= 0xffffffffu; k++) {
        seen++;
        const uint32_t u = (uint32_t)k;
        const float x = u2f(u);
        const uint16_t hi = kern_split_hi(x), lo = kern_split_lo(x, hi);
        const float y = kern_split_join(hi, lo);
        if (isnan(x)) {
            nans++;
            bad_nan += !isnan(y) || !bf16_is_nan(hi);
            continue;
        }
        bad_join += f2u(y) != u;
        const uint32_t low = u & 0xffffu;
        if (low == 0 || low == 1 || low == 0x7fff || low == 0x8000 || low == 0x8001 ||
            low == 0xffff || (k * 0x9e3779b97f4a7c15ull) >> 56 == 0) {
            checked_hi++;
            bad_hi += hi != ref_split_hi(x);
        }
    }
    ok(bad_join == 0 && seen == ((size_t)1 << 32) && nans == ((size_t)1 << 24) - 2,
       "split master: all %zu non-NaN f32 patterns come back bit for bit from (hi, lo) (%zu "
       "wrong)",
       seen - nans, bad_join);
    ok(bad_nan == 0 && nans == ((size_t)1 << 24) - 2,
       "split master: every NaN pattern (%zu) gives a NaN hi and joins to a NaN (%zu wrong)", nans,
       bad_nan);
    ok(bad_hi == 0 && checked_hi > 16000000,
       "split master: hi is the nearest bf16, ties away from zero, on %zu patterns (ties and "
       "their neighbours of every upper half, 1/256 of the rest; %zu wrong)",
       checked_hi, bad_hi);
    /* Where it differs from bmt_f32_to_bf16 (ties to even): only at ties. */
    const float tie_even = u2f(0x3f808000u); /* 1.00390625: between 0x3f80 and 0x3f81 */
    const float tie_odd = u2f(0x3f818000u), tie_neg = u2f(0xbf808000u);
    ok(kern_split_hi(tie_even) == 0x3f81 && bmt_f32_to_bf16(tie_even) == 0x3f80 &&
           kern_split_hi(tie_odd) == 0x3f82 && bmt_f32_to_bf16(tie_odd) == 0x3f82 &&
           kern_split_hi(tie_neg) == 0xbf81 && kern_split_hi(u2f(0x7f7f8000u)) == 0x7f80 &&
           kern_split_hi(u2f(0x7f7f7fffu)) == 0x7f7f,
       "split master: a tie rounds away from zero (0x3f808000 -> 0x3f81 where ties to even give "
       "0x3f80), and the largest values to inf from half an ulp up");

    /* kern_adamw_split against kern_adamw with an f32 master: the same
     * master, m and v bit for bit after every step, hi its kern_split_hi. */
    const size_t n = 4099;
    hyper_t h = { 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f };
    float *master = xmalloc(n * 4), *m = xmalloc(n * 4), *v = xmalloc(n * 4);
    float *sm = xmalloc(n * 4), *sv = xmalloc(n * 4), *joined = xmalloc(n * 4);
    float *grad = xmalloc(n * 4);
    uint16_t *hi = xmalloc(n * 2), *lo = xmalloc(n * 2), *pb = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        master[i] = bmt_bf16_to_f32(bmt_f32_to_bf16((float)(rnd_unit() * 4 - 2)));
    for (size_t i = 0; i < n; i++) /* as bmt_adamw_create: the bf16 shard, lo 0 */
        hi[i] = bmt_f32_to_bf16(master[i]);
    memset(lo, 0, n * 2);
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    memset(sm, 0, n * 4);
    memset(sv, 0, n * 4);
    size_t same_master = 0, same_mv = 0, same_hi = 0, ties = 0, off_tie = 0, rc_bad = 0;
    bmt_error_t err;
    for (int t = 1; t <= ADAMW_STEPS; t++) {
        for (size_t i = 0; i < n; i++)
            grad[i] = rnd_float(6, 3);
        kern_adamw_args_t a = { h.lr,
                                h.beta1,
                                h.beta2,
                                h.eps,
                                t % 2 ? h.wd : 0.0f,
                                h.grad_scale,
                                (float)(1 - pow(h.beta1, t)),
                                (float)(1 - pow(h.beta2, t)),
                                (float)(1.0 - h.beta1),
                                (float)(1.0 - h.beta2) };
        rc_bad += kern_adamw(ctx, NULL, master, m, v, grad, pb, BMT_BF16, n, &a, &err) != 0;
        rc_bad += kern_adamw_split(ctx, NULL, hi, lo, sm, sv, grad, n, &a, &err) != 0;
        kern_join_host(hi, lo, joined, n);
        for (size_t i = 0; i < n; i++) {
            same_master += f2u(joined[i]) == f2u(master[i]);
            same_mv += f2u(sm[i]) == f2u(m[i]) && f2u(sv[i]) == f2u(v[i]);
            same_hi += hi[i] == ref_split_hi(master[i]);
            /* where ties to even rounded the other way: only at ties */
            ties += hi[i] != pb[i];
            off_tie += hi[i] != pb[i] && (f2u(master[i]) & 0xffffu) != 0x8000u;
        }
    }
    const size_t total = n * ADAMW_STEPS;
    ok(rc_bad == 0 && same_master == total && same_mv == total && same_hi == total,
       "adamw split, %d steps: the master joined from (hi, lo), m and v are kern_adamw's bit for "
       "bit, hi the master's nearest bf16 (%zu, %zu, %zu of %zu)",
       ADAMW_STEPS, same_master, same_mv, same_hi, total);
    ok(ties > 0 && off_tie == 0,
       "adamw split: hi differs from kern_adamw's bf16 param (ties to even) in %zu of %zu updates, "
       "each at a tie (%zu elsewhere)",
       ties, total, off_tie);
    /* A master exactly at a tie, left where it is (no gradient, no decay). */
    float tie_master = tie_even, z = 0, zm = 0, zv = 0;
    uint16_t th = kern_split_hi(tie_master), tl = kern_split_lo(tie_master, th);
    kern_adamw_args_t still = {
        1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 0.1f, 0.001f, 0.1f, 0.001f
    };
    int rc = kern_adamw_split(ctx, NULL, &th, &tl, &zm, &zv, &z, 1, &still, &err);
    ok(rc == 0 && th == 0x3f81 && f2u(kern_split_join(th, tl)) == 0x3f808000u,
       "adamw split: a master at a tie stays exact, its hi rounded away from zero");
    /* Errors change nothing. */
    memcpy(joined, sm, n * 4);
    still.bc2 = 0;
    rc = kern_adamw_split(ctx, NULL, hi, lo, sm, sv, grad, n, &still, &err);
    ok(rc == -1 && strstr(err.text, "kern_adamw_split") && memcmp(joined, sm, n * 4) == 0,
       "adamw split: bc2 = 0 is an error that changes nothing (%s)", err.text);
    still.bc2 = 0.001f;
    rc = kern_adamw_split(ctx, NULL, hi, NULL, sm, sv, grad, n, &still, &err);
    ok(rc == -1, "adamw split: a NULL buffer is an error (%s)", err.text);
    free(master), free(m), free(v), free(sm), free(sv), free(joined), free(grad);
    free(hi), free(lo), free(pb);
}

int main(void)
{
    ctx = calloc(1, sizeof(*ctx));
    ctx->device = BMT_DEVICE_CPU;
    ctx->device_index = -1;
    ctx->rank = 0;

    test_philox_kat();
    test_key();
    test_reference();
    test_init_kernel();
    test_layout_invariance();
    test_statistics();
    test_streams();
    test_zero();
    test_cast();
    test_accumulate();
    test_sumsq();
    test_adamw();
    test_split_master();
    test_context_errors();
    free(ctx);
    return done_testing();
}
