/* tests/fuzz/st_convert.c — libFuzzer target: bmt_st_convert on random bytes.
 *
 * Input: one selector byte, then the source elements (a trailing partial
 * element is dropped). Selector bits 0-1: the source dtype (F64, F32, F16,
 * BF16); bits 2-3: the destination (f32, bf16, f64; 3 reads as f32); bits 4-6:
 * how many bytes src and dst sit past an aligned address (no alignment is
 * required); bit 7 set: bits 0-3 and 4-6 are a raw source and destination
 * dtype instead, mostly unsupported pairs, which must return -1 and write
 * nothing. Source and destination have buffers of their exact size.
 *
 * Each element is checked against its value computed here from the format's
 * definition, in double: same dtype is a bitwise copy; widening (f16, bf16,
 * f32 to f32 or f64) is exact; f64 to f32 is C's rounding; to bf16 is the
 * nearest bf16 (ties to even where the distances are exact), overflowing to
 * infinity from 2^128 - 2^119 up; NaN stays NaN and the sign is kept.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "st_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const bmt_st_dtype_t srcs[4] = { BMT_ST_F64, BMT_ST_F32, BMT_ST_F16, BMT_ST_BF16 };
static const bmt_dtype_t dsts[4] = { BMT_F32, BMT_BF16, BMT_F64, BMT_F32 };

static double f16_value(uint16_t h) /* from the IEEE definition */
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double bf16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
    return s ? -v : v;
}

/* Element i of src as an exact double. */
static double value(const unsigned char *src, bmt_st_dtype_t sdt, size_t i)
{
    double d;
    float f;
    uint16_t h;
    switch (sdt) {
    case BMT_ST_F64: memcpy(&d, src + 8 * i, 8); return d;
    case BMT_ST_F32: memcpy(&f, src + 4 * i, 4); return f;
    case BMT_ST_F16: memcpy(&h, src + 2 * i, 2); return f16_value(h);
    default: memcpy(&h, src + 2 * i, 2); return bf16_value(h);
    }
}

/* r (the bits of a finite, non-NaN bf16 result) is the nearest bf16 to v. */
static void check_nearest_bf16(uint16_t r, double v)
{
    double rv = bf16_value(r);
    long double dist = fabsl((long double)rv - v);
    /* Rounding a difference is monotonic, so a farther neighbour never looks
     * nearer; only a tie needs the distances exact (for |v| >= 2^-120 they fit
     * 64 bits: v has 53, the distance is under a bf16 quantum of v). */
    for (int step = -1; step <= 1; step += 2) {
        uint16_t mag = r & 0x7fffu;
        if ((step < 0 && mag == 0) || (step > 0 && mag >= 0x7f7fu))
            continue;
        double nv = bf16_value((uint16_t)((r & 0x8000u) | (uint16_t)(mag + step)));
        long double nd = fabsl((long double)nv - v);
        CHECK(dist <= nd);
        if (dist == nd && fabs(v) >= 0x1p-120)
            CHECK((r & 1u) == 0); /* a tie goes to the even one */
    }
}

static void check_unsupported(const uint8_t *data, size_t size, int sdt, int ddt)
{
    unsigned char dst[64];
    memset(dst, 0xa5, sizeof(dst));
    size_t n = size > 8 ? 8 : size;
    int rc = bmt_st_convert(data, (bmt_st_dtype_t)sdt, dst, (bmt_dtype_t)ddt, n);
    CHECK(rc == -1);
    for (size_t i = 0; i < sizeof(dst); i++)
        CHECK(dst[i] == 0xa5);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned sel = data[0];
    bmt_st_dtype_t sdt = srcs[sel & 3];
    bmt_dtype_t ddt = dsts[(sel >> 2) & 3];
    size_t skew = (sel >> 4) & 7;
    if (sel & 0x80) {
        int s = (int)(sel & 15), d = (int)((sel >> 4) & 7);
        bool ok = (s == BMT_ST_F64 || s == BMT_ST_F32 || s == BMT_ST_F16 || s == BMT_ST_BF16) &&
                  d < BMT_DTYPE_COUNT;
        if (!ok) {
            check_unsupported(data + 1, size - 1, s, d);
            return 0;
        }
        sdt = (bmt_st_dtype_t)s;
        ddt = (bmt_dtype_t)d;
        skew = 0;
    }
    size_t isz = bmt_st_dtype_size(sdt), osz = bmt_dtype_size(ddt), n = (size - 1) / isz;
    unsigned char *sbuf = malloc(skew + n * isz + 1), *dbuf = malloc(skew + n * osz + 1);
    CHECK(sbuf != NULL && dbuf != NULL);
    unsigned char *src = sbuf + skew, *dst = dbuf + skew; /* (n) elements each, unaligned */
    memcpy(src, data + 1, n * isz);
    CHECK(bmt_st_convert(src, sdt, dst, ddt, n) == 0);
    for (size_t i = 0; i < n; i++) {
        double v = value(src, sdt, i);
        if (ddt == BMT_F64) {
            double r;
            memcpy(&r, dst + 8 * i, 8);
            if (sdt == BMT_ST_F64)
                CHECK(memcmp(dst + 8 * i, src + 8 * i, 8) == 0);
            else
                CHECK(isnan(v) ? isnan(r) : r == v && signbit(r) == signbit(v));
        } else if (ddt == BMT_F32) {
            float r;
            memcpy(&r, dst + 4 * i, 4);
            if (sdt == BMT_ST_F32)
                CHECK(memcmp(dst + 4 * i, src + 4 * i, 4) == 0);
            else if (isnan(v))
                CHECK(isnan(r));
            else
                CHECK(r == (float)v && signbit(r) == signbit(v)); /* exact unless from f64 */
        } else {
            uint16_t r;
            memcpy(&r, dst + 2 * i, 2);
            double rv = bf16_value(r);
            if (sdt == BMT_ST_BF16)
                CHECK(memcmp(dst + 2 * i, src + 2 * i, 2) == 0);
            else if (isnan(v))
                CHECK(isnan(rv));
            else if (isinf(v))
                CHECK(rv == v);
            else if (isinf(rv))
                CHECK(signbit(rv) == signbit(v) && fabs(v) >= 0x1p128 - 0x1p119);
            else {
                CHECK(signbit(rv) == signbit(v));
                check_nearest_bf16(r, v);
            }
        }
    }
    free(sbuf);
    free(dbuf);
    return 0;
}
