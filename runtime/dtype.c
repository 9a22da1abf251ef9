/* runtime/dtype.c — element types: sizes, names, bf16 conversion and finite scans on the host.
 *
 * bf16 is the upper half of an IEEE f32. Conversion rounds to nearest even, as
 * CUDA's __float2bfloat16_rn does, and keeps NaN a (quiet) NaN instead of letting
 * rounding carry it into infinity.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "block.h"
#include "bmt/bmt.h"

size_t bmt_dtype_size(bmt_dtype_t dtype)
{
    switch (dtype) {
    case BMT_F32: return 4;
    case BMT_BF16: return 2;
    case BMT_F64: return 8;
    default: return 0;
    }
}

const char *bmt_dtype_name(bmt_dtype_t dtype)
{
    switch (dtype) {
    case BMT_F32: return "f32";
    case BMT_BF16: return "bf16";
    case BMT_F64: return "f64";
    default: return "invalid dtype";
    }
}

const char *bmt_op_name(bmt_op_t op)
{
    switch (op) {
    case BMT_SUM: return "sum";
    case BMT_AVG: return "avg";
    case BMT_MAX: return "max";
    default: return "invalid op";
    }
}

uint16_t bmt_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force a quiet payload */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float bmt_bf16_to_f32(uint16_t x)
{
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* The first of n values of dtype t at p that is not finite (nan, +-inf): its
 * index, or -1. Exponent bits all ones, so no float arithmetic is needed. */
int64_t dtype_first_nonfinite(const void *p, bmt_dtype_t t, size_t n)
{
    if (t == BMT_F32) {
        const uint32_t *v = p;
        for (size_t i = 0; i < n; i++)
            if ((v[i] & 0x7f800000u) == 0x7f800000u)
                return (int64_t)i;
    } else if (t == BMT_BF16) {
        const uint16_t *v = p;
        for (size_t i = 0; i < n; i++)
            if ((v[i] & 0x7f80u) == 0x7f80u)
                return (int64_t)i;
    } else if (t == BMT_F64) {
        const uint64_t *v = p;
        for (size_t i = 0; i < n; i++)
            if ((v[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull)
                return (int64_t)i;
    }
    return -1;
}

/* "nan", "inf" or "-inf": what element i of p (dtype t) holds. */
const char *dtype_nonfinite_name(const void *p, bmt_dtype_t t, size_t i)
{
    bool nan, neg;
    if (t == BMT_F32) {
        uint32_t v = ((const uint32_t *)p)[i];
        nan = (v & 0x007fffffu) != 0, neg = v >> 31;
    } else if (t == BMT_BF16) {
        uint16_t v = ((const uint16_t *)p)[i];
        nan = (v & 0x007fu) != 0, neg = v >> 15;
    } else {
        uint64_t v = ((const uint64_t *)p)[i];
        nan = (v & 0x000fffffffffffffull) != 0, neg = v >> 63;
    }
    return nan ? "nan" : neg ? "-inf" : "inf";
}
