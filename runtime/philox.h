/* runtime/philox.h — the counter-based generator behind parameter initialization.
 *
 * Header-only, compiled three times: by the C compiler for the host, and by nvcc
 * for the host and the device (BMT_HD). The host's value (bmt_init_value, the cpu
 * kernels) and the device's (runtime/cuda/kernels.cu) run this same code, so they
 * differ only where libm and CUDA's math library round differently (last bits).
 *
 * Philox 4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
 * 1, 2, 3", SC 2011) with Random123's constants; checked against Random123's
 * tests/kat_vectors in tests/unit/test_kernels.c.
 *
 * An element's value depends only on (key, element index), never on who computes
 * it or in which pieces (DESIGN.md §4 invariant 2):
 *   counter = { lo32(index), hi32(index), 0, 0 },  r = philox4x32_10(counter, key)
 *   ua = u01(r[0], r[1]), ub = u01(r[2], r[3])      53 random bits each, in (0, 1)
 *   ZEROS 0, ONES 1, CONSTANT a
 *   UNIFORM       a + (b - a) ua
 *   NORMAL        a + b sqrt(-2 ln ua) cos(2 pi ub)                 (Box-Muller)
 *   TRUNC_NORMAL  a + b z, z = Phi^-1(Phi(-2) + ua (Phi(2) - Phi(-2))), |z| <= 2
 * all in double, then times scale (0 means 1). The key of a parameter:
 *   key64 = mix64(fnv1a(name, 0xcbf29ce484222325) ^ mix64(seed ^ 0x5eed))
 *   key = { lo32(key64), hi32(key64) }
 */
#ifndef BMT_RUNTIME_PHILOX_H
#define BMT_RUNTIME_PHILOX_H

#include <math.h>
#include <stdint.h>

#include "bmt/block.h"
#include "hash.h"

#ifndef BMT_HD
#ifdef __CUDACC__
#define BMT_HD __host__ __device__
#else
#define BMT_HD
#endif
#endif

/* Double operations rounded one at a time: on the device nvcc would otherwise
 * fuse a * b + c into an fma, which the host does not. */
#ifdef __CUDA_ARCH__
#define PHILOX_ADD(x, y) __dadd_rn((x), (y))
#define PHILOX_MUL(x, y) __dmul_rn((x), (y))
#else
#define PHILOX_ADD(x, y) ((x) + (y))
#define PHILOX_MUL(x, y) ((x) * (y))
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* out = Philox 4x32 with `rounds` rounds of ctr under key (10 is the standard;
 * other counts exist only to check the round function against more vectors). */
BMT_HD static inline void philox4x32_rounds(const uint32_t ctr[4], const uint32_t key[2],
                                            int rounds, uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < rounds; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0; /* nvcc: one mul.wide.u32 */
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

BMT_HD static inline void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                        uint32_t out[4])
{
    philox4x32_rounds(ctr, key, 10, out);
}

/* A double in (0, 1) from the top 53 bits of (hi:lo). The one value that would be
 * 0 becomes 2^-54; the largest is 1 - 2^-53. Exact: no rounding anywhere. */
BMT_HD static inline double philox_u01(uint32_t hi, uint32_t lo)
{
    uint64_t bits = (((uint64_t)hi << 32) | lo) >> 11;
    return bits == 0 ? 0x1p-54 : (double)bits * 0x1p-53;
}

/* Phi^-1(p) for p in (0, 0.5]: Acklam's rational approximation (relative error
 * 1.15e-9) refined by one Halley step on erfc, which brings it to double
 * precision. Written here because the host's libm has no erfinv and the device
 * must run the identical code. */
BMT_HD static inline double philox_norm_quantile_lower(double p)
{
    const double a1 = -3.969683028665376e+01, a2 = 2.209460984245205e+02,
                 a3 = -2.759285104469687e+02, a4 = 1.383577518672690e+02,
                 a5 = -3.066479806614716e+01, a6 = 2.506628277459239e+00;
    const double b1 = -5.447609879822406e+01, b2 = 1.615858368580409e+02,
                 b3 = -1.556989798598866e+02, b4 = 6.680131188771972e+01,
                 b5 = -1.328068155288572e+01;
    const double c1 = -7.784894002430293e-03, c2 = -3.223964580411365e-01,
                 c3 = -2.400758277161838e+00, c4 = -2.549732539343734e+00,
                 c5 = 4.374664141464968e+00, c6 = 2.938163982698783e+00;
    const double d1 = 7.784695709041462e-03, d2 = 3.224671290700398e-01, d3 = 2.445134137142996e+00,
                 d4 = 3.754408661907416e+00;
    double x;
    if (p < 0.02425) {
        double q = sqrt(-2.0 * log(p));
        x = (((((c1 * q + c2) * q + c3) * q + c4) * q + c5) * q + c6) /
            ((((d1 * q + d2) * q + d3) * q + d4) * q + 1.0);
    } else {
        double q = p - 0.5, r = q * q;
        x = (((((a1 * r + a2) * r + a3) * r + a4) * r + a5) * r + a6) * q /
            (((((b1 * r + b2) * r + b3) * r + b4) * r + b5) * r + 1.0);
    }
    /* Halley: e = Phi(x) - p, with Phi(x) = erfc(-x / sqrt 2) / 2 (x <= 0: no
     * cancellation), u = e / phi(x). */
    double e = 0.5 * erfc(-x * 0.70710678118654752440) - p;
    double u = e * 2.50662827463100050242 * exp(0.5 * x * x);
    return x - u / PHILOX_ADD(1.0, PHILOX_MUL(0.5 * x, u));
}

/* The value of element index of the parameter with this key (see the top). An
 * unknown kind gives NaN; callers validate the kind first. */
BMT_HD static inline double philox_init_value(const uint32_t key[2], uint64_t index, int kind,
                                              double a, double b, double scale)
{
    double v;
    if (kind == BMT_INIT_ZEROS) {
        v = 0.0;
    } else if (kind == BMT_INIT_ONES) {
        v = 1.0;
    } else if (kind == BMT_INIT_CONSTANT) {
        v = a;
    } else {
        const uint32_t ctr[4] = { (uint32_t)index, (uint32_t)(index >> 32), 0u, 0u };
        uint32_t r[4];
        philox4x32_10(ctr, key, r);
        double ua = philox_u01(r[0], r[1]);
        double ub = philox_u01(r[2], r[3]);
        if (kind == BMT_INIT_UNIFORM) {
            v = PHILOX_ADD(a, PHILOX_MUL(b - a, ua));
        } else if (kind == BMT_INIT_NORMAL) {
            double rad = sqrt(-2.0 * log(ua)), c = cos(6.28318530717958647693 * ub);
            v = PHILOX_ADD(a, PHILOX_MUL(b, PHILOX_MUL(rad, c)));
        } else if (kind == BMT_INIT_TRUNC_NORMAL) {
            /* Work in the lower half, where the tail probability is small and
             * exact: t = min(ua, 1 - ua) (1 - ua is exact for ua >= 1/2), then
             * mirror. Phi(-2) and Phi(2) - Phi(-2) = erf(sqrt 2) as literals. */
            double t = ua < 0.5 ? ua : 1.0 - ua;
            double p = PHILOX_ADD(0.02275013194817920720, PHILOX_MUL(t, 0.95449973610364158560));
            double z = philox_norm_quantile_lower(p);
            z = fmin(fmax(z, -2.0), 0.0);
            v = PHILOX_ADD(a, PHILOX_MUL(b, ua < 0.5 ? z : -z));
        } else {
            return NAN;
        }
    }
    return scale == 0.0 ? v : PHILOX_MUL(v, scale);
}

/* The Philox key of a parameter (host only: names live on the host). */
static inline void philox_key(uint64_t seed, const char *name, uint32_t key[2])
{
    uint64_t k = mix64(fnv1a(name, 0xcbf29ce484222325ULL) ^ mix64(seed ^ 0x5eedULL));
    key[0] = (uint32_t)k;
    key[1] = (uint32_t)(k >> 32);
}

#endif
