/* runtime/checksum.c — XXH3-64 for checkpoint bytes (see checksum.h).
 *
 * xxHash is compiled in from its header (XXH_INLINE_ALL, the library's own
 * header-only mode): its functions become static to this file, so nothing of
 * it is exported from libbmt and nothing is needed at run time.
 */
#include "checksum.h"

#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t ck_hash(const void *p, size_t n) { return (uint64_t)XXH3_64bits(p, n); }

struct ck_stream {
    XXH3_state_t *st;
};

ck_stream_t *ck_begin(void)
{
    ck_stream_t *s = malloc(sizeof(*s));
    if (s == NULL)
        return NULL;
    if ((s->st = XXH3_createState()) == NULL || XXH3_64bits_reset(s->st) != XXH_OK) {
        XXH3_freeState(s->st);
        free(s);
        return NULL;
    }
    return s;
}

void ck_update(ck_stream_t *s, const void *p, size_t n) { XXH3_64bits_update(s->st, p, n); }

uint64_t ck_end(ck_stream_t *s)
{
    uint64_t h = (uint64_t)XXH3_64bits_digest(s->st);
    XXH3_freeState(s->st);
    free(s);
    return h;
}

void ck_hex(uint64_t h, char out[17])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, h >>= 4)
        out[i] = digits[h & 15];
    out[16] = '\0';
}

bool ck_parse_hex(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    int i = 0;
    for (; s && i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    if (s == NULL || s[16] != '\0')
        return false;
    *out = v;
    return true;
}
