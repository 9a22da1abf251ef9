/* tests/unit/test_safetensors.c — the safetensors reader (runtime/safetensors.c).
 *
 *   test_safetensors             the pure checks: headers (a table of valid ones
 *                                and one of expected failures with their exact
 *                                messages), listing, discovery on synthetic name
 *                                lists, conversions against references computed
 *                                here in double precision, read argument errors;
 *   test_safetensors DIR         also the file checks listed in DIR/cases.tsv,
 *                                written by tests/tools/st_write.py with numpy's
 *                                (and torch's) values beside them: listings,
 *                                metadata, plans, every element of each read range
 *                                in f32, bf16 and f64, the exact number of bytes
 *                                each open and read takes from the files
 *                                (/proc/self/io rchar), a copy of a file truncated
 *                                after open (DIR is left as it was);
 *   (both)                       checksummed reads (bmt_st_set_checksums) of a file
 *                                written here, units cut through elements: the
 *                                same values as unchecked reads in every dtype, a
 *                                flipped bit refused by reads and bmt_st_verify,
 *                                units that do not tile and a damaged header
 *                                refused;
 *   test_safetensors --open PATH          list PATH and its plan (exit 1: open
 *                                failed, 2: discovery failed; the error on stderr);
 *   test_safetensors --read PATH NAME FIRST COUNT   print elements as f32;
 *   test_safetensors --ckpt save|load|async2 DIR [--name N] [--bf16] [--no-optim]
 *                           BLOCK[:PARAM]...
 *                                a model of those blocks, each with one parameter
 *                                (default "w") of 4 elements, under bmt_init (one
 *                                process, or under bmlaunch), saved as DIR/N
 *                                (default "ck") or loaded from DIR; "async2" starts
 *                                two async saves before finishing either. Prints
 *                                "ckpt: <block>.<param> = v0 v1 v2 v3" per block
 *                                (exit 0), or "ckpt: refused: <error>" (exit 3).
 * tests/integration/test_safetensors.sh drives --open and --read, and
 * tests/integration/test_ckpt.sh --ckpt (checkpoints of models the trainers
 * cannot build: blocks of one name, long names, other dtypes).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/ckpt.h"
#include "bmt/optim.h"
#include "bmt/safetensors.h"
#include "tap.h"

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd64(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double bits_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static bool bf16_isnan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

/* A header written with ' for " (so the tables stay readable). */
static char *dq(const char *s)
{
    char *t = strdup(s);
    for (char *c = t; *c; c++)
        if (*c == '\'')
            *c = '"';
    return t;
}

static bmt_st_t *parse(const char *text, uint64_t data_len, const char *file, bmt_error_t *err)
{
    char *h = dq(text);
    bmt_st_t *st = bmt_st_parse(h, strlen(h), data_len, file, err);
    free(h);
    return st;
}

/* ------------------------------------------------------------ reference rounding */

/* x (exact in a double) rounded to p significant bits, to nearest, ties to
 * even, with a quantum of at least 2^qmin (subnormals) and +-inf from 2^emax
 * up. Plain arithmetic in double, independent of the bit tricks under test. */
static double ref_round(double x, int p, int qmin, int emax)
{
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    double a = fabs(x);
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int qe = e - p < qmin ? qmin : e - p;
    double q = ldexp(1.0, qe);
    double lo = floor(a / q) * q, r = a - lo, res;
    if (r > q / 2)
        res = lo + q;
    else if (r < q / 2)
        res = lo;
    else
        res = fmod(lo / q, 2.0) == 0 ? lo : lo + q;
    if (res >= ldexp(1.0, emax))
        res = INFINITY;
    return copysign(res, x);
}

static double ref_bf16_value(double x) { return ref_round(x, 8, -133, 128); }
static double ref_f32_value(double x) { return ref_round(x, 24, -149, 128); }

/* The bf16 bits of a value that bf16 represents (not NaN). */
static uint16_t bf16_of_value(double v) { return (uint16_t)(f32_bits((float)v) >> 16); }

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

/* ------------------------------------------------------------ headers */

typedef struct {
    const char *what;
    const char *header; /* ' stands for " */
    uint64_t data_len;
    const char *file; /* NULL: "x.safetensors" */
    const char *want; /* NULL: valid; else the start of the error text (all of it
                         where it does not quote Jansson) */
    int count;        /* valid: number of tensors */
} header_case_t;

/* An F32 entry of n elements at bytes [b, e). */
#define T4(name, n, b, e)                                                                          \
    "'" name "':{'dtype':'F32','shape':[" #n "],'data_offsets':[" #b "," #e "]}"

static const header_case_t headers[] = {
    /* valid */
    { "empty object", "{}", 0, NULL, NULL, 0 },
    { "padded with spaces to 8 bytes", "{}      ", 0, NULL, NULL, 0 },
    { "one F32 2x3", "{'a':{'dtype':'F32','shape':[2,3],'data_offsets':[0,24]}}", 24, NULL, NULL,
      1 },
    { "a scalar F64", "{'s':{'dtype':'F64','shape':[],'data_offsets':[0,8]}}", 8, NULL, NULL, 1 },
    { "a zero-size tensor at the start of another",
      "{'z':{'dtype':'F32','shape':[0,4],'data_offsets':[0,0]},"
      "'b':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}",
      4, NULL, NULL, 2 },
    { "offsets in any order of names",
      "{'a':{'dtype':'I32','shape':[1],'data_offsets':[4,8]},"
      "'b':{'dtype':'U8','shape':[4],'data_offsets':[0,4]}}",
      8, NULL, NULL, 2 },
    { "unknown keys in an entry are ignored",
      "{'a':{'dtype':'F16','shape':[2],'data_offsets':[0,4],'extra':[1]}}", 4, NULL, NULL, 1 },
    { "__metadata__ null", "{'__metadata__':null}", 0, NULL, NULL, 0 },
    { "__metadata__ of strings",
      "{'__metadata__':{'format':'pt','x':''},'a':{'dtype':'BOOL','shape':[3],'data_offsets':[0,3]}"
      "}",
      3, NULL, NULL, 1 },
    { "the largest tensor that fits 2^63 bytes",
      "{'a':{'dtype':'U8','shape':[0,9223372036854775807],'data_offsets':[0,0]}}", 0, NULL, NULL,
      1 },
    /* invalid */
    { "empty header", "", 0, NULL, "x.safetensors: header is empty, not a JSON object", 0 },
    { "an array", "[1, 2]", 0, NULL,
      "x.safetensors: header is not a JSON object (it starts with '[')", 0 },
    { "a leading space", " {}", 0, NULL,
      "x.safetensors: header is not a JSON object (it starts with byte 0x20)", 0 },
    { "cut JSON", "{'a':", 0, NULL, "x.safetensors: header is not valid JSON: ", 0 },
    { "trailing garbage", "{} x", 0, NULL, "x.safetensors: header is not valid JSON: ", 0 },
    { "a duplicate name", "{" T4("a", 1, 0, 4) "," T4("a", 1, 4, 8) "}", 8, NULL,
      "x.safetensors: header is not valid JSON: duplicate object key", 0 },
    { "invalid UTF-8", "{'\xff':{}}", 0, NULL, "x.safetensors: header is not valid JSON: ", 0 },
    { "an offset past 2^63",
      "{'a':{'dtype':'U8','shape':[0],'data_offsets':[0,18446744073709551616]}}", 0, NULL,
      "x.safetensors: header is not valid JSON: ", 0 },
    { "entry not an object", "{'a':5}", 0, NULL,
      "x.safetensors: tensor 'a': entry is not an object", 0 },
    { "no dtype", "{'a':{'shape':[1],'data_offsets':[0,4]}}", 4, NULL,
      "x.safetensors: tensor 'a': dtype is missing", 0 },
    { "dtype a number", "{'a':{'dtype':5,'shape':[1],'data_offsets':[0,4]}}", 4, NULL,
      "x.safetensors: tensor 'a': dtype is not a string", 0 },
    { "unknown dtype", "{'a':{'dtype':'Q8','shape':[1],'data_offsets':[0,1]}}", 1, NULL,
      "x.safetensors: tensor 'a': unknown dtype 'Q8'", 0 },
    { "lower-case dtype", "{'a':{'dtype':'f32','shape':[1],'data_offsets':[0,4]}}", 4, NULL,
      "x.safetensors: tensor 'a': unknown dtype 'f32'", 0 },
    { "no shape", "{'a':{'dtype':'F32','data_offsets':[0,4]}}", 4, NULL,
      "x.safetensors: tensor 'a': shape is missing", 0 },
    { "shape a number", "{'a':{'dtype':'F32','shape':3,'data_offsets':[0,12]}}", 12, NULL,
      "x.safetensors: tensor 'a': shape is not an array", 0 },
    { "negative dimension", "{'a':{'dtype':'F32','shape':[2,-1],'data_offsets':[0,0]}}", 0, NULL,
      "x.safetensors: tensor 'a': shape[1] is not a non-negative integer", 0 },
    { "real dimension", "{'a':{'dtype':'F32','shape':[2.0],'data_offsets':[0,8]}}", 8, NULL,
      "x.safetensors: tensor 'a': shape[0] is not a non-negative integer", 0 },
    { "nine dimensions", "{'a':{'dtype':'F32','shape':[1,1,1,1,1,1,1,1,1],'data_offsets':[0,4]}}",
      4, NULL, "x.safetensors: tensor 'a': shape has 9 dimensions (at most 8)", 0 },
    { "element count overflows",
      "{'a':{'dtype':'F32','shape':[4294967296,4294967296],'data_offsets':[0,0]}}", 0, NULL,
      "x.safetensors: tensor 'a': shape [4294967296, 4294967296] of F32 is more than 2^63 bytes",
      0 },
    { "byte count overflows",
      "{'a':{'dtype':'F32','shape':[2305843009213693952],'data_offsets':[0,0]}}", 0, NULL,
      "x.safetensors: tensor 'a': shape [2305843009213693952] of F32 is more than 2^63 bytes", 0 },
    { "no data_offsets", "{'a':{'dtype':'F32','shape':[1]}}", 4, NULL,
      "x.safetensors: tensor 'a': data_offsets is missing", 0 },
    { "one offset", "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0]}}", 4, NULL,
      "x.safetensors: tensor 'a': data_offsets is not [begin, end] (two non-negative integers)",
      0 },
    { "offsets as strings", "{'a':{'dtype':'F32','shape':[1],'data_offsets':['0','4']}}", 4, NULL,
      "x.safetensors: tensor 'a': data_offsets is not [begin, end] (two non-negative integers)",
      0 },
    { "negative offset", "{'a':{'dtype':'F32','shape':[1],'data_offsets':[-4,0]}}", 4, NULL,
      "x.safetensors: tensor 'a': data_offsets is not [begin, end] (two non-negative integers)",
      0 },
    { "decreasing offsets",
      "{'h.3.attn.c_attn.weight':{'dtype':'U8','shape':[10],'data_offsets':[100,90]}}", 100,
      "model-00002-of-00003.safetensors",
      "model-00002-of-00003.safetensors: tensor 'h.3.attn.c_attn.weight': data_offsets [100, 90] "
      "are not increasing",
      0 },
    { "past the data section", "{" T4("a", 6, 0, 24) "}", 16, NULL,
      "x.safetensors: tensor 'a': data_offsets [0, 24] run past the data section (16 bytes)", 0 },
    { "bytes do not match the shape", "{'a':{'dtype':'F32','shape':[2,3],'data_offsets':[0,20]}}",
      20, NULL,
      "x.safetensors: tensor 'a': data_offsets [0, 20] hold 20 bytes; F32 [2, 3] needs 24", 0 },
    { "overlap", "{" T4("a", 4, 0, 16) "," T4("b", 4, 8, 24) "}", 24, NULL,
      "x.safetensors: tensors 'a' [0, 16] and 'b' [8, 24] overlap", 0 },
    { "the same bytes twice", "{" T4("b", 4, 0, 16) "," T4("a", 4, 0, 16) "}", 16, NULL,
      "x.safetensors: tensors 'a' [0, 16] and 'b' [0, 16] overlap", 0 },
    { "a zero-size tensor inside another",
      "{" T4("a", 4, 0, 16) ",'z':{'dtype':'F32','shape':[0],'data_offsets':[8,8]}}", 16, NULL,
      "x.safetensors: tensors 'a' [0, 16] and 'z' [8, 8] overlap", 0 },
    { "a hole", "{" T4("a", 4, 0, 16) "," T4("b", 2, 24, 32) "}", 32, NULL,
      "x.safetensors: bytes [16, 24) of the data section belong to no tensor (a hole before 'b')",
      0 },
    { "a hole at the start", "{" T4("a", 2, 8, 16) "}", 16, NULL,
      "x.safetensors: bytes [0, 8) of the data section belong to no tensor (a hole before 'a')",
      0 },
    { "bytes after the last tensor", "{" T4("a", 4, 0, 16) "}", 20, NULL,
      "x.safetensors: bytes [16, 20) at the end of the data section belong to no tensor", 0 },
    { "data but no tensors", "{}", 4, NULL,
      "x.safetensors: bytes [0, 4) at the end of the data section belong to no tensor", 0 },
    { "__metadata__ a string", "{'__metadata__':'pt'}", 0, NULL,
      "x.safetensors: __metadata__ is not an object of strings", 0 },
    { "__metadata__ value a number", "{'__metadata__':{'n':1}}", 0, NULL,
      "x.safetensors: __metadata__ 'n' is not a string", 0 },
    /* Errors stay one printable line (tests/fuzz found Jansson quoting a raw
     * newline: tests/fuzz/regressions/st_header/newline-in-json-error). */
    { "a newline in a tensor name", "{'a\\nb':5}", 0, NULL,
      "x.safetensors: tensor 'a?b': entry is not an object", 0 },
    { "a raw newline near a JSON error", "{'a\\u00\n':1}", 0, NULL,
      "x.safetensors: header is not valid JSON: invalid escape near '\"a\\u00?' (at byte 8)", 0 },
};

/* One line of printable characters (bmt/error.h). */
static bool printable(const char *text)
{
    for (const char *c = text; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return false;
    return true;
}

static void test_headers(void)
{
    int n = (int)(sizeof(headers) / sizeof(headers[0]));
    for (int i = 0; i < n; i++) {
        const header_case_t *c = &headers[i];
        bmt_error_t err = { { 0 } };
        bmt_st_t *st = parse(c->header, c->data_len, c->file ? c->file : "x.safetensors", &err);
        if (c->want == NULL) {
            if (!ok(st != NULL, "header: %s: valid", c->what))
                diag("error: %s", err.text);
            else
                is_int(bmt_st_count(st), c->count, "header: tensor count");
        } else {
            ok(st == NULL && strncmp(err.text, c->want, strlen(c->want)) == 0 &&
                   printable(err.text),
               "header: %s: refused with \"%s\"", c->what, c->want);
            if (st != NULL || strncmp(err.text, c->want, strlen(c->want)) != 0)
                diag("got \"%s\"", st ? "(accepted)" : err.text);
        }
        bmt_st_close(st);
    }
}

/* Every dtype, listed with its size; and the listing of one header. */
static void test_listing(void)
{
    char json[4096];
    size_t len = (size_t)snprintf(json, sizeof(json), "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int d = BMT_ST_DTYPE_COUNT - 1; d >= 0; d--) { /* reverse: names sort differently */
        size_t sz = bmt_st_dtype_size((bmt_st_dtype_t)d);
        len += (size_t)snprintf(
            json + len, sizeof(json) - len,
            ",\"t.%s\":{\"dtype\":\"%s\",\"shape\":[3,1],\"data_offsets\":[%llu,%llu]}",
            bmt_st_dtype_name((bmt_st_dtype_t)d), bmt_st_dtype_name((bmt_st_dtype_t)d),
            (unsigned long long)off, (unsigned long long)(off + 3 * sz));
        off += 3 * sz;
    }
    len += (size_t)snprintf(json + len, sizeof(json) - len, "}");
    bmt_error_t err = { { 0 } };
    bmt_st_t *st = bmt_st_parse(json, len, off, "all.safetensors", &err);
    if (!ok(st != NULL, "listing: a header with all 15 dtypes parses")) {
        diag("%s", err.text);
        return;
    }
    is_int(bmt_st_count(st), BMT_ST_DTYPE_COUNT, "listing: 15 tensors");
    static const char *const sorted[] = { "t.BF16",    "t.BOOL",    "t.F16", "t.F32", "t.F64",
                                          "t.F8_E4M3", "t.F8_E5M2", "t.I16", "t.I32", "t.I64",
                                          "t.I8",      "t.U16",     "t.U32", "t.U64", "t.U8" };
    static const size_t sizes[] = { 2, 1, 2, 4, 8, 1, 1, 2, 4, 8, 1, 2, 4, 8, 1 };
    bool order = true, fields = true, find = true;
    int64_t total = 0;
    for (int i = 0; i < BMT_ST_DTYPE_COUNT; i++) {
        const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
        order &= t != NULL && strcmp(t->name, sorted[i]) == 0;
        if (t == NULL)
            break;
        fields &= strcmp(bmt_st_dtype_name(t->dtype), sorted[i] + 2) == 0 && t->ndim == 2 &&
                  t->shape[0] == 3 && t->shape[1] == 1 && t->shape[2] == 0 && t->numel == 3 &&
                  t->nbytes == (int64_t)(3 * sizes[i]) && bmt_st_dtype_size(t->dtype) == sizes[i] &&
                  strcmp(t->file, "all.safetensors") == 0 && t->offset >= 8 + (int64_t)len &&
                  t->offset + t->nbytes <= 8 + (int64_t)(len + off);
        find &= bmt_st_find(st, sorted[i]) == i;
        total += t->nbytes;
    }
    ok(order, "listing: tensors sorted by name");
    ok(fields, "listing: dtype, shape, numel, nbytes, file and offset of every tensor");
    is_int(total, (int64_t)off, "listing: the tensors' bytes add up to the data section");
    /* t.U64 was written first (reverse order): at the start of the data section. */
    is_int(bmt_st_tensor(st, bmt_st_find(st, "t.U64"))->offset, 8 + (int64_t)len,
           "listing: offset is absolute (8 + header + data_offsets.begin)");
    ok(find && bmt_st_find(st, "t.F33") == -1 && bmt_st_find(st, "") == -1 &&
           bmt_st_find(st, NULL) == -1,
       "listing: bmt_st_find finds every name and only those");
    ok(bmt_st_tensor(st, -1) == NULL && bmt_st_tensor(st, BMT_ST_DTYPE_COUNT) == NULL,
       "listing: bmt_st_tensor out of range is NULL");
    is_str(bmt_st_metadata(st, "format"), "pt", "listing: __metadata__ format = pt");
    ok(bmt_st_metadata(st, "nope") == NULL && bmt_st_metadata(NULL, "format") == NULL,
       "listing: absent metadata is NULL");
    ok(strcmp(bmt_st_dtype_name(BMT_ST_DTYPE_COUNT), "invalid") == 0 &&
           bmt_st_dtype_size(BMT_ST_DTYPE_COUNT) == 0,
       "listing: an invalid dtype has no name and no size");

    /* Reading without a file, and every argument error, each naming file and tensor. */
    float buf[4];
    int i64 = bmt_st_find(st, "t.I64"), f32 = bmt_st_find(st, "t.F32");
    static const struct {
        int which; /* 0: t.F32, 1: t.I64, 2: index 99 */
        int64_t first, count;
        int dtype;
        const char *want;
    } bad[] = {
        { 0, 0, 3, BMT_F32,
          "all.safetensors: tensor 't.F32': no file behind this header (bmt_st_parse)" },
        { 0, -1, 1, BMT_F32,
          "all.safetensors: tensor 't.F32': 1 elements from element -1 are out of range (it has "
          "3)" },
        { 0, 2, 2, BMT_F32,
          "all.safetensors: tensor 't.F32': 2 elements from element 2 are out of range (it has "
          "3)" },
        { 0, 4, 0, BMT_F32,
          "all.safetensors: tensor 't.F32': 0 elements from element 4 are out of range (it has "
          "3)" },
        { 0, 1, INT64_MAX, BMT_F32,
          "all.safetensors: tensor 't.F32': 9223372036854775807 elements from element 1 are out of "
          "range" },
        { 0, 0, 1, 7,
          "all.safetensors: tensor 't.F32': destination dtype 7 is not f32, bf16 or f64" },
        { 1, 0, 1, BMT_F32,
          "all.safetensors: tensor 't.I64': is I64; only F64, F32, F16 and BF16 convert to f32" },
        { 2, 0, 1, BMT_F32, "all.safetensors: bmt_st_read: no tensor 99 (the checkpoint has 15)" },
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        int idx = bad[k].which == 0 ? f32 : bad[k].which == 1 ? i64 : 99;
        memset(buf, 0x5a, sizeof(buf));
        int rc =
            bmt_st_read(st, idx, bad[k].first, bad[k].count, buf, (bmt_dtype_t)bad[k].dtype, &err);
        ok(rc == -1 && strncmp(err.text, bad[k].want, strlen(bad[k].want)) == 0 &&
               f32_bits(buf[0]) == 0x5a5a5a5au,
           "read refused, dst untouched: %s", bad[k].want);
        if (rc != -1 || strncmp(err.text, bad[k].want, strlen(bad[k].want)) != 0)
            diag("got \"%s\"", rc == -1 ? err.text : "(accepted)");
    }
    ok(bmt_st_read(st, f32, 3, 0, NULL, BMT_F32, &err) == 0,
       "read: count 0 at the end succeeds and reads nothing");
    ok(bmt_st_read(NULL, 0, 0, 1, buf, BMT_F32, &err) == -1, "read: NULL handle refused");
    bmt_st_close(st);
    bmt_st_close(NULL);
    ok(1, "bmt_st_close(NULL) is a no-op");

    /* Thousands of tensors: every one is found (binary search over the sort). */
    int many = 5000;
    size_t cap = (size_t)many * 96 + 16;
    char *big = malloc(cap);
    int *at = malloc((size_t)many * sizeof(*at)); /* at[j]: where "layer.j.w" was written */
    len = (size_t)snprintf(big, cap, "{");
    for (int i = 0; i < many; i++)
        at[(i * 7919) % many] = i;
    for (int i = 0; i < many; i++)
        len += (size_t)snprintf(
            big + len, cap - len,
            "%s\"layer.%d.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
            i ? "," : "", (i * 7919) % many, i, i + 1);
    len += (size_t)snprintf(big + len, cap - len, "}");
    st = bmt_st_parse(big, len, (uint64_t)many, "many.safetensors", &err);
    bool all = st != NULL && bmt_st_count(st) == many;
    for (int i = 0; all && i < many; i++) {
        char name[32];
        snprintf(name, sizeof(name), "layer.%d.w", i);
        int k = bmt_st_find(st, name);
        all = k >= 0 && strcmp(bmt_st_tensor(st, k)->name, name) == 0 &&
              bmt_st_tensor(st, k)->offset == 8 + (int64_t)len + at[i];
    }
    ok(all, "listing: 5000 tensors, each found at its own offset");
    bmt_st_close(st);
    free(big);
    free(at);
}

/* ------------------------------------------------------------ index in memory */

typedef struct {
    const char *file;
    uint64_t data_len;
    const char *header; /* ' stands for " */
} shard_case_t;

typedef struct {
    const char *what;
    const char *index;      /* ' stands for " */
    shard_case_t shards[3]; /* up to 3; file NULL ends the list */
    const char *want;       /* NULL: valid; else the start of the error */
    int count;              /* valid: number of tensors */
} index_case_t;

#define WM4 "'weight_map':{'a':'s1.safetensors','b':'s1.safetensors','c':'s2.safetensors'"
#define S1                                                                                         \
    {                                                                                              \
        "s1.safetensors", 8, "{" T4("a", 1, 0, 4) "," T4("b", 1, 4, 8) "}"                         \
    }
#define S2                                                                                         \
    {                                                                                              \
        "s2.safetensors", 4, "{" T4("c", 1, 0, 4) "}"                                              \
    }

/* The index messages of docs/safetensors.md, through bmt_st_parse_index at
 * ckpt/idx.json (bmt_st_open's index path runs the same code). */
static const index_case_t index_cases[] = {
    { "two shards", "{'metadata':{'total_size':12}," WM4 "}}", { S1, S2 }, NULL, 3 },
    { "a shard no one names is ignored",
      "{'weight_map':{'c':'s2.safetensors'}}",
      { S1, S2 },
      NULL,
      1 },
    { "a shard in a subdirectory",
      "{'weight_map':{'c':'sub/s2.safetensors'}}",
      { { "sub/s2.safetensors", 4, "{" T4("c", 1, 0, 4) "}" } },
      NULL,
      1 },
    { "not JSON", "{", { S1 }, "idx.json: not valid JSON: ", 0 },
    { "not an object", "[]", { S1 }, "idx.json: not a JSON object", 0 },
    { "no weight_map", "{'metadata':{}}", { S1 }, "idx.json: no \"weight_map\" object", 0 },
    { "an empty weight_map",
      "{'weight_map':{}}",
      { S1 },
      "idx.json: weight_map names no tensors",
      0 },
    { "metadata not an object",
      "{'metadata':[1]," WM4 "}}",
      { S1, S2 },
      "idx.json: \"metadata\" is not an object",
      0 },
    { "a file name that is not a string",
      "{'weight_map':{'a':5}}",
      { S1 },
      "idx.json: tensor 'a': weight_map gives no file name",
      0 },
    { "a file outside the directory",
      "{'weight_map':{'a':'../s1.safetensors'}}",
      { S1 },
      "idx.json: tensor 'a': file '../s1.safetensors' is outside the index's directory",
      0 },
    { "an absolute file name",
      "{'weight_map':{'a':'/s1.safetensors'}}",
      { S1 },
      "idx.json: tensor 'a': file '/s1.safetensors' is outside the index's directory",
      0 },
    { "a file that is not there",
      "{" WM4 ",'d':'s3.safetensors'}}",
      { S1, S2 },
      "ckpt/s3.safetensors: cannot open: No such file or directory",
      0 },
    { "a bad shard header",
      "{" WM4 "}}",
      { S1, { "s2.safetensors", 4, "{" T4("c", 1, 0, 8) "}" } },
      "s2.safetensors: tensor 'c': data_offsets [0, 8] run past the data section (4 bytes)",
      0 },
    { "a mapped tensor missing",
      "{" WM4 ",'d':'s2.safetensors'}}",
      { S1, S2 },
      "s2.safetensors: tensor 'd': not in the file, but idx.json's weight_map puts it there",
      0 },
    { "in another file than mapped",
      "{'weight_map':{'a':'s1.safetensors','b':'s2.safetensors','c':'s2.safetensors'}}",
      { S1, S2 },
      "idx.json: tensor 'b': is in 's1.safetensors', but weight_map says "
      "'s2.safetensors'",
      0 },
    { "a tensor not in the map",
      "{'weight_map':{'a':'s1.safetensors','c':'s2.safetensors'}}",
      { S1, S2 },
      "s1.safetensors: tensor 'b': not in idx.json's weight_map",
      0 },
    { "in two files",
      "{" WM4 "}}",
      { S1, { "s2.safetensors", 8, "{" T4("c", 1, 0, 4) "," T4("b", 1, 4, 8) "}" } },
      "idx.json: tensor 'b': is in both 's1.safetensors' and 's2.safetensors'",
      0 },
};

static void test_index(void)
{
    int n = (int)(sizeof(index_cases) / sizeof(index_cases[0]));
    for (int i = 0; i < n; i++) {
        const index_case_t *c = &index_cases[i];
        bmt_st_shard_t shards[3];
        char *text[3] = { NULL, NULL, NULL };
        int ns = 0;
        for (; ns < 3 && c->shards[ns].file; ns++) {
            text[ns] = dq(c->shards[ns].header);
            shards[ns] = (bmt_st_shard_t){ c->shards[ns].file, text[ns], strlen(text[ns]),
                                           c->shards[ns].data_len };
        }
        char *json = dq(c->index);
        bmt_error_t err = { { 0 } };
        bmt_st_t *st = bmt_st_parse_index(json, strlen(json), "ckpt/idx.json", shards, ns, &err);
        if (c->want == NULL) {
            if (!ok(st != NULL, "index: %s: valid", c->what))
                diag("error: %s", err.text);
            else
                is_int(bmt_st_count(st), c->count, "index: tensor count");
        } else {
            ok(st == NULL && strncmp(err.text, c->want, strlen(c->want)) == 0,
               "index: %s: refused with \"%s\"", c->what, c->want);
            if (st != NULL || strncmp(err.text, c->want, strlen(c->want)) != 0)
                diag("got \"%s\"", st ? "(accepted)" : err.text);
        }
        if (i == 0 && st != NULL) { /* two shards: where each tensor is, metadata, no reads */
            const bmt_st_tensor_t *b = bmt_st_tensor(st, bmt_st_find(st, "b"));
            const bmt_st_tensor_t *t = bmt_st_tensor(st, bmt_st_find(st, "c"));
            ok(b && t && strcmp(b->file, "ckpt/s1.safetensors") == 0 &&
                   b->offset == 8 + (int64_t)strlen(text[0]) + 4 &&
                   strcmp(t->file, "ckpt/s2.safetensors") == 0 &&
                   t->offset == 8 + (int64_t)strlen(text[1]),
               "index: each tensor's file is the index's directory + its shard, at its offset");
            is_str(bmt_st_metadata(st, "total_size"), "12", "index: metadata total_size = 12");
            float f;
            ok(bmt_st_read(st, 0, 0, 1, &f, BMT_F32, &err) == -1 &&
                   strstr(err.text, "no file behind this header") != NULL,
               "index: reading without files is refused");
        }
        bmt_st_close(st);
        free(json);
        for (int k = 0; k < ns; k++)
            free(text[k]);
    }
    bmt_error_t err = { { 0 } };
    ok(bmt_st_parse_index(NULL, 3, NULL, NULL, 0, &err) == NULL &&
           strcmp(err.text, "bmt_st_parse_index: the index is NULL") == 0,
       "index: a NULL index is refused");
    ok(bmt_st_parse_index("{}", 2, NULL, NULL, -1, &err) == NULL &&
           strncmp(err.text, "bmt_st_parse_index: -1 shards", 29) == 0,
       "index: a negative shard count is refused");
    ok(bmt_st_parse_index("{}", 2, NULL, NULL, 0, &err) == NULL &&
           strcmp(err.text, BMT_ST_INDEX_NAME ": no \"weight_map\" object") == 0,
       "index: without a path, errors name " BMT_ST_INDEX_NAME);
}

/* ------------------------------------------------------------ discovery */

/* A header of tensors laid end to end: "name" (U8 [1]) or "name=2x3" (U8). */
static bmt_st_t *from_names(const char *const *spec, int n, bmt_error_t *err)
{
    size_t cap = 64 + (size_t)n * 256, len = 1;
    char *json = malloc(cap);
    json[0] = '{';
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(spec[i], '=');
        int nlen = eq ? (int)(eq - spec[i]) : (int)strlen(spec[i]);
        char shape[64] = "1";
        uint64_t numel = 1;
        if (eq) {
            snprintf(shape, sizeof(shape), "%s", eq + 1);
            numel = 1;
            for (char *c = shape; *c; c++)
                if (*c == 'x')
                    *c = ',';
            for (char *c = shape; c && *c; c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL)
                numel *= strtoull(c, NULL, 10);
        }
        len += (size_t)snprintf(
            json + len, cap - len,
            "%s\"%.*s\":{\"dtype\":\"U8\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
            i ? "," : "", nlen, spec[i], shape, (unsigned long long)off,
            (unsigned long long)(off + numel));
        off += numel;
    }
    len += (size_t)snprintf(json + len, cap - len, "}");
    bmt_st_t *st = bmt_st_parse(json, len, off, "model.safetensors", err);
    free(json);
    return st;
}

/* "head(2) h.0(12) ... tail(2)", and whether every block's names agree with the
 * tensors they index (layer: block name + "." + relative name). */
static bool summarize(const bmt_st_t *st, const bmt_st_plan_t *p, char *buf, size_t len)
{
    size_t used = 0;
    bool consistent = p->nblocks == p->nlayers + 2;
    buf[0] = '\0';
    for (int b = 0; b < p->nblocks; b++) {
        const bmt_st_block_t *k = &p->blocks[b];
        used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%s(%d)", b ? " " : "",
                                 k->name, k->count);
        consistent &= k->kind == (b == 0                ? BMT_ST_HEAD
                                  : b == p->nblocks - 1 ? BMT_ST_TAIL
                                                        : BMT_ST_LAYER);
        consistent &= k->layer == (k->kind == BMT_ST_LAYER ? b - 1 : -1);
        for (int j = 0; j < k->count; j++) {
            const char *full = bmt_st_tensor(st, k->tensors[j])->name;
            char want[256];
            if (k->kind == BMT_ST_LAYER)
                snprintf(want, sizeof(want), "%s.%s", k->name, k->names[j]);
            else
                snprintf(want, sizeof(want), "%s", k->names[j]);
            consistent &= strcmp(full, want) == 0;
            if (j > 0)
                consistent &= strcmp(k->names[j - 1], k->names[j]) < 0;
        }
    }
    return consistent;
}

#define GPT2_LAYER(p)                                                                              \
    p "ln_1.weight=8", p "ln_1.bias=8", p "attn.c_attn.weight=8x24", p "attn.c_attn.bias=24",      \
        p "attn.c_proj.weight=8x8", p "attn.c_proj.bias=8", p "ln_2.weight=8", p "ln_2.bias=8",    \
        p "mlp.c_fc.weight=8x32", p "mlp.c_fc.bias=32", p "mlp.c_proj.weight=32x8",                \
        p "mlp.c_proj.bias=8"

static const char *const gpt2[] = { "wte.weight=64x8",  GPT2_LAYER("h.0."), "wpe.weight=16x8",
                                    GPT2_LAYER("h.1."), GPT2_LAYER("h.2."), "ln_f.weight=8",
                                    "ln_f.bias=8" };
static const char *const gpt2_tf[] = {
    "transformer.wte.weight=64x8",  "transformer.wpe.weight=16x8",  GPT2_LAYER("transformer.h.2."),
    GPT2_LAYER("transformer.h.0."), GPT2_LAYER("transformer.h.1."), "transformer.ln_f.weight=8",
    "transformer.ln_f.bias=8",      "lm_head.weight=64x8"
};
#define LLAMA_LAYER(p)                                                                             \
    p "self_attn.q_proj.weight=8x8", p "self_attn.k_proj.weight=4x8",                              \
        p "self_attn.v_proj.weight=4x8", p "self_attn.o_proj.weight=8x8",                          \
        p "mlp.gate_proj.weight=16x8", p "mlp.up_proj.weight=16x8", p "mlp.down_proj.weight=8x16", \
        p "input_layernorm.weight=8", p "post_attention_layernorm.weight=8"
static const char *const llama[] = { "model.embed_tokens.weight=32x8",
                                     LLAMA_LAYER("model.layers.0."), LLAMA_LAYER("model.layers.1."),
                                     "model.norm.weight=8", "lm_head.weight=32x8" };
static const char *const twelve[] = { "h.0.w", "h.1.w", "h.2.w", "h.3.w", "h.4.w",  "h.5.w",
                                      "h.6.w", "h.7.w", "h.8.w", "h.9.w", "h.10.w", "h.11.w" };
static const char *const words[] = { "enc.layer.1.x", "enc.layer.0.x", "mh.0.x",
                                     "h.x.0.y",       "h.0",           "tok_embeddings.weight",
                                     "norm.h.weight" };
static const char *const nested[] = { "model.layers.1.experts.3.w", "model.layers.0.experts.3.w",
                                      "model.layers.0.experts.10.w",
                                      "model.layers.1.experts.10.w" };
static const char *const blocks_word[] = { "blocks.1.attn.w=2", "blocks.0.attn.w=2", "pos_emb=4",
                                           "tok_emb.weight=4", "head.weight=4" };
static const char *const none[] = { "embed.w", "fc.w", "out.b" };
static const char *const gap[] = { "h.0.w", "h.1.w", "h.3.w" };
static const char *const fewer[] = { "h.0.a", "h.0.b", "h.1.a", "h.2.a", "h.2.b" };
static const char *const more[] = { "h.0.a", "h.1.a", "h.1.c" };
static const char *const shapes[] = { "h.0.a=2x3", "h.1.a=2x3", "h.2.a=3x2" };
static const char *const ranks[] = { "h.0.a=6", "h.1.a=2x3" };
static const char *const stacks[] = { "encoder.layer.0.x", "decoder.layers.0.x" };
static const char *const zero[] = { "h.00.x", "h.1.x" };
static const char *const huge[] = { "h.100000.x" };
static const char *const no0[] = { "h.1.x" };

typedef struct {
    const char *what;
    const char *const *names;
    int n;
    const char *want;   /* the plan summary, or the error text */
    const char *prefix; /* valid: the plan's layer_prefix */
} discover_case_t;

#define N(a) a, (int)(sizeof(a) / sizeof(a[0]))
static const discover_case_t discover_cases[] = {
    { "HF GPT-2", N(gpt2), "head(2) h.0(12) h.1(12) h.2(12) tail(2)", "h." },
    { "HF GPT-2 with transformer. and lm_head", N(gpt2_tf),
      "head(2) transformer.h.0(12) transformer.h.1(12) transformer.h.2(12) tail(3)",
      "transformer.h." },
    { "Llama", N(llama), "head(1) model.layers.0(9) model.layers.1(9) tail(2)", "model.layers." },
    { "12 layers in numeric order (2 < 10)", N(twelve),
      "head(0) h.0(1) h.1(1) h.2(1) h.3(1) h.4(1) h.5(1) h.6(1) h.7(1) h.8(1) h.9(1) h.10(1) "
      "h.11(1) tail(0)",
      "h." },
    { "whole components only; layer words anywhere", N(words),
      "head(1) enc.layer.0(1) enc.layer.1(1) tail(4)", "enc.layer." },
    { "the first number is the layer", N(nested), NULL, NULL },
    { "blocks., pos_emb and tok_emb", N(blocks_word), "head(2) blocks.0(1) blocks.1(1) tail(1)",
      "blocks." },
    { "no layers", N(none), "head(1) tail(2)", "" },
    { "a gap", N(gap),
      "model.safetensors: layer 'h.2' is missing: the stack goes up to 'h.3' but has no tensor of "
      "layer 2",
      NULL },
    { "no layer 0", N(no0),
      "model.safetensors: layer 'h.0' is missing: the stack goes up to 'h.1' but has no tensor of "
      "layer 0",
      NULL },
    { "a layer lacks a tensor", N(fewer),
      "model.safetensors: layer 'h.1' has no tensor 'b' (layer 'h.0' has)", NULL },
    { "a layer has an extra tensor", N(more),
      "model.safetensors: layer 'h.1' has tensor 'c', which layer 'h.0' lacks", NULL },
    { "a layer's shape differs", N(shapes),
      "model.safetensors: tensor 'h.2.a': shape [3, 2] differs from [2, 3] in layer 'h.0'", NULL },
    { "a layer's rank differs", N(ranks),
      "model.safetensors: tensor 'h.1.a': shape [2, 3] differs from [6] in layer 'h.0'", NULL },
    { "two stacks", N(stacks),
      "model.safetensors: tensors 'decoder.layers.0.x' and 'encoder.layer.0.x' are in two layer "
      "stacks ('decoder.layers' and 'encoder.layer'); bmt discovers one",
      NULL },
    { "a leading zero", N(zero),
      "model.safetensors: tensor 'h.00.x': layer number '00' has a leading zero", NULL },
    { "a layer number too large", N(huge),
      "model.safetensors: tensor 'h.100000.x': layer number 100000 is too large (at most 99999)",
      NULL },
};

static void test_discover(void)
{
    int n = (int)(sizeof(discover_cases) / sizeof(discover_cases[0]));
    for (int i = 0; i < n; i++) {
        const discover_case_t *c = &discover_cases[i];
        bmt_error_t err = { { 0 } };
        bmt_st_t *st = from_names(c->names, c->n, &err);
        if (!ok(st != NULL, "discover: %s: header parses", c->what)) {
            diag("%s", err.text);
            continue;
        }
        bmt_st_plan_t *plan = NULL;
        int rc = bmt_st_discover(st, &plan, &err);
        bool valid = c->prefix != NULL || c->want == NULL;
        if (valid && c->want != NULL) {
            char sum[512];
            if (ok(rc == 0, "discover: %s: a plan", c->what)) {
                ok(summarize(st, plan, sum, sizeof(sum)),
                   "discover: %s: block kinds, layer numbers, indices and names agree", c->what);
                is_str(sum, c->want, "discover: blocks in model order");
                is_str(plan->layer_prefix, c->prefix, "discover: layer prefix");
            } else {
                diag("%s", err.text);
            }
        } else if (!valid) {
            ok(rc == -1 && plan == NULL, "discover: %s: refused", c->what);
            is_str(err.text, c->want, "discover: the error names layer and tensor");
        }
        if (c->names == nested) { /* layer from the first number; names keep the rest */
            ok(rc == 0 && plan->nlayers == 2 && plan->blocks[1].count == 2 &&
                   strcmp(plan->blocks[1].names[0], "experts.10.w") == 0 &&
                   strcmp(plan->blocks[1].names[1], "experts.3.w") == 0 &&
                   plan->blocks[0].count == 0 && plan->blocks[3].count == 0,
               "discover: model.layers.N.experts.M.w is layer N with name experts.M.w");
        }
        if (c->names == gpt2 && rc == 0) {
            static const char *const rel[] = {
                "attn.c_attn.bias", "attn.c_attn.weight", "attn.c_proj.bias", "attn.c_proj.weight",
                "ln_1.bias",        "ln_1.weight",        "ln_2.bias",        "ln_2.weight",
                "mlp.c_fc.bias",    "mlp.c_fc.weight",    "mlp.c_proj.bias",  "mlp.c_proj.weight",
            };
            bool same = true;
            for (int l = 1; l <= 3; l++)
                for (int j = 0; j < 12; j++)
                    same &= strcmp(plan->blocks[l].names[j], rel[j]) == 0;
            ok(same, "discover: GPT-2 layers list the 12 relative names, sorted");
            ok(strcmp(plan->blocks[0].names[0], "wpe.weight") == 0 &&
                   strcmp(plan->blocks[0].names[1], "wte.weight") == 0 &&
                   strcmp(plan->blocks[4].names[0], "ln_f.bias") == 0,
               "discover: GPT-2 head wpe, wte; tail ln_f");
        }
        if (c->names == twelve && rc == 0)
            ok(strcmp(plan->blocks[3].name, "h.2") == 0 &&
                   strcmp(plan->blocks[11].name, "h.10") == 0 &&
                   strcmp(bmt_st_tensor(st, plan->blocks[11].tensors[0])->name, "h.10.w") == 0,
               "discover: h.2 is block 3 and h.10 block 11 (numeric, not strcmp, order)");
        bmt_st_plan_free(plan);
        bmt_st_close(st);
    }
    bmt_st_plan_free(NULL);
    bmt_error_t err;
    ok(bmt_st_discover(NULL, NULL, &err) == -1, "discover: NULL refused");

    /* A gap is refused before anything is allocated per layer: tests/fuzz found
     * a 4 KB header (a 4000-byte prefix, layer 99999) costing 400 MB of block
     * names. With an 8 MB prefix that would be 800 GB, which no allocator
     * grants ("out of memory"); now it is the gap's message, at once. */
    size_t plen = 8u << 20, len = 0;
    char *json = malloc(plen + 128);
    len += (size_t)sprintf(json, "{\"");
    memset(json + len, 'a', plen);
    len += plen;
    len += (size_t)sprintf(json + len,
                           ".h.99999.x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    bmt_st_t *st = bmt_st_parse(json, len, 1, "model.safetensors", &err);
    bmt_st_plan_t *plan = NULL;
    int rc = st ? bmt_st_discover(st, &plan, &err) : -2;
    char a600[601], want[2048]; /* block names are quoted up to 600 bytes here */
    memset(a600, 'a', 600);
    a600[600] = '\0';
    snprintf(want, sizeof(want),
             "model.safetensors: layer '%s' is missing: the stack goes up to '%s' but has no "
             "tensor of layer 0",
             a600, a600);
    ok(rc == -1 && plan == NULL && strcmp(err.text, want) == 0,
       "discover: layer 99999 under an 8 MB prefix: the gap is refused, nothing allocated per "
       "layer");
    if (rc != -1 || strcmp(err.text, want) != 0)
        diag("got \"%s\"", rc == -2 ? "(header refused)" : rc == 0 ? "(a plan)" : err.text);
    bmt_st_plan_free(plan);
    bmt_st_close(st);
    free(json);
}

/* ------------------------------------------------------------ conversion */

static void test_convert(void)
{
    enum {
        H = 65536
    };
    uint16_t *h = malloc(H * sizeof(*h)), *b = malloc(H * sizeof(*b));
    float *f = malloc(H * sizeof(*f));
    double *d = malloc(H * sizeof(*d));
    for (int i = 0; i < H; i++)
        h[i] = (uint16_t)i;

    /* f16 -> f32 and f64: every pattern, exact (subnormals included). */
    bool f32ok = bmt_st_convert(h, BMT_ST_F16, f, BMT_F32, H) == 0;
    bool f64ok = bmt_st_convert(h, BMT_ST_F16, d, BMT_F64, H) == 0;
    bool bfok = bmt_st_convert(h, BMT_ST_F16, b, BMT_BF16, H) == 0;
    int bad32 = 0, bad64 = 0, badbf = 0, subnormals = 0;
    for (int i = 0; i < H; i++) {
        double v = f16_value(h[i]);
        if (isnan(v)) {
            bad32 += !isnan(f[i]) || !signbit(f[i]) != !signbit(v);
            bad64 += !isnan(d[i]);
            badbf += !bf16_isnan(b[i]);
            continue;
        }
        subnormals += ((i >> 10) & 31) == 0 && (i & 1023) != 0;
        bad32 += f32_bits(f[i]) != f32_bits((float)v); /* v is exact in f32 */
        bad64 += memcmp(&d[i], &v, 8) != 0;
        badbf += b[i] != bf16_of_value(ref_bf16_value(v));
    }
    ok(f32ok && bad32 == 0,
       "convert: f16 -> f32, all 65536 patterns (%d subnormals) exact (%d wrong)", subnormals,
       bad32);
    ok(f64ok && bad64 == 0, "convert: f16 -> f64 exact (%d wrong)", bad64);
    ok(bfok && badbf == 0, "convert: f16 -> bf16 rounds once to nearest even (%d wrong)", badbf);
    ok(b[0x0001] == 0x3380 && b[0x8001] == 0xb380 && b[0x7c00] == 0x7f80 && b[0xfc00] == 0xff80,
       "convert: f16 -> bf16 of 2^-24, -2^-24, inf, -inf");

    /* bf16 -> f32, f64, bf16: every pattern; and the round trip back. */
    f32ok = bmt_st_convert(h, BMT_ST_BF16, f, BMT_F32, H) == 0;
    f64ok = bmt_st_convert(h, BMT_ST_BF16, d, BMT_F64, H) == 0;
    bfok = bmt_st_convert(h, BMT_ST_BF16, b, BMT_BF16, H) == 0;
    bad32 = bad64 = badbf = 0;
    int trip = 0;
    uint16_t *back = malloc(H * sizeof(*back));
    bmt_st_convert(f, BMT_ST_F32, back, BMT_BF16, H);
    for (int i = 0; i < H; i++) {
        double v = bf16_value(h[i]);
        if (isnan(v)) {
            bad32 += !isnan(f[i]);
            bad64 += !isnan(d[i]);
            trip += !bf16_isnan(back[i]);
        } else {
            bad32 += f32_bits(f[i]) != f32_bits((float)v);
            bad64 += d[i] != v || !signbit(d[i]) != !signbit(v);
            trip += back[i] != h[i];
        }
        badbf += b[i] != h[i];
    }
    ok(f32ok && f64ok && bfok && bad32 + bad64 + badbf == 0,
       "convert: bf16 -> f32, f64 exact and bf16 -> bf16 a copy (%d, %d, %d wrong)", bad32, bad64,
       badbf);
    is_int(trip, 0, "convert: bf16 -> f32 -> bf16 gives back every pattern (NaN stays NaN)");
    free(back);

    /* f32 -> bf16: named cases, then random patterns against ref_round. */
    static const struct {
        uint32_t in;
        uint16_t want;
        const char *what;
    } f32cases[] = {
        { 0x3f800000u, 0x3f80, "1" },
        { 0x3f808000u, 0x3f80, "1 + 2^-8: a tie, to even (down)" },
        { 0x3f818000u, 0x3f82, "1 + 3 2^-8: a tie, to even (up)" },
        { 0x3f808001u, 0x3f81, "just above a tie: up" },
        { 0x3f807fffu, 0x3f80, "just below a tie: down" },
        { 0xbf818000u, 0xbf82, "-(1 + 3 2^-8): a tie, to even" },
        { 0x7f7f7fffu, 0x7f7f, "below the largest tie: the largest bf16" },
        { 0x7f7f8000u, 0x7f80, "the largest tie: odd, to even = inf" },
        { 0x7f7fffffu, 0x7f80, "FLT_MAX: inf" },
        { 0x7f800000u, 0x7f80, "inf" },
        { 0xff800000u, 0xff80, "-inf" },
        { 0x80000000u, 0x8000, "-0" },
        { 0x00000001u, 0x0000, "the smallest subnormal: 0" },
        { 0x00008000u, 0x0000, "a subnormal tie, even: 0" },
        { 0x00018000u, 0x0002, "a subnormal tie, odd: up" },
        { 0x00800000u, 0x0080, "the smallest normal" },
    };
    for (size_t k = 0; k < sizeof(f32cases) / sizeof(f32cases[0]); k++) {
        float x = bits_f32(f32cases[k].in);
        uint16_t got = 0;
        bmt_st_convert(&x, BMT_ST_F32, &got, BMT_BF16, 1);
        ok(got == f32cases[k].want && got == bf16_of_value(ref_bf16_value(x)),
           "convert: f32 0x%08x -> bf16 0x%04x: %s", f32cases[k].in, f32cases[k].want,
           f32cases[k].what);
    }
    static const uint32_t nans[] = { 0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu };
    bool nanok = true;
    for (size_t k = 0; k < sizeof(nans) / sizeof(nans[0]); k++) {
        float x = bits_f32(nans[k]);
        uint16_t got = 0;
        bmt_st_convert(&x, BMT_ST_F32, &got, BMT_BF16, 1);
        nanok &= bf16_isnan(got) && (got >> 15) == (nans[k] >> 31);
    }
    ok(nanok, "convert: f32 NaNs (quiet, signaling, negative) stay NaN in bf16 with their sign");

    enum {
        R = 1 << 20
    };
    float *rf = malloc(R * sizeof(*rf));
    uint16_t *rb = malloc(R * sizeof(*rb));
    for (int i = 0; i < R; i++) {
        uint32_t u = (uint32_t)rnd64();
        if ((u & 0x7f800000u) == 0x7f800000u)
            u &= 0xbfffffffu; /* no inf/NaN here: covered above */
        rf[i] = bits_f32(u);
    }
    bmt_st_convert(rf, BMT_ST_F32, rb, BMT_BF16, R);
    int wrong = 0;
    for (int i = 0; i < R; i++)
        wrong += rb[i] != bf16_of_value(ref_bf16_value(rf[i]));
    is_int(wrong, 0, "convert: f32 -> bf16 of 2^20 random patterns = nearest-even reference");

    /* f64 -> bf16 rounds once: values that double rounding through f32 gets wrong. */
    static const struct {
        double in;
        uint16_t want;
        const char *what;
    } f64cases[] = {
        { 1.0 + 0x1p-8 + 0x1p-30, 0x3f81, "1 + 2^-8 + 2^-30: above the tie (f32 first would tie)" },
        { 1.0 + 0x1p-8 - 0x1p-30, 0x3f80, "1 + 2^-8 - 2^-30: below the tie" },
        { 1.0 + 0x1p-8, 0x3f80, "1 + 2^-8: a tie, to even" },
        { -(1.0 + 3 * 0x1p-8 - 0x1p-40), (uint16_t)0xbf81, "-(1 + 3 2^-8 - 2^-40): below the tie" },
        { 1e300, 0x7f80, "1e300: inf" },
        { -1e300, 0xff80, "-1e300: -inf" },
        { 1e-300, 0x0000, "1e-300: 0" },
        { -1e-300, 0x8000, "-1e-300: -0" },
        { 0x1p-133, 0x0001, "2^-133: the smallest bf16 subnormal" },
        { 0x1p-134, 0x0000, "2^-134: a tie at zero, to even" },
        { 0x1p-134 + 0x1p-160, 0x0001, "2^-134 + 2^-160: above that tie" },
        { 0x1.ffp127, 0x7f80, "(2 - 2^-8) 2^127, the largest tie: to even = inf" },
        { 0x1.fefffffffffffp127, 0x7f7f, "just below it: the largest finite bf16" },
    };
    for (size_t k = 0; k < sizeof(f64cases) / sizeof(f64cases[0]); k++) {
        uint16_t got = 0;
        bmt_st_convert(&f64cases[k].in, BMT_ST_F64, &got, BMT_BF16, 1);
        ok(got == f64cases[k].want && got == bf16_of_value(ref_bf16_value(f64cases[k].in)),
           "convert: f64 -> bf16 0x%04x: %s", f64cases[k].want, f64cases[k].what);
        if (got != f64cases[k].want)
            diag("got 0x%04x", got);
    }
    double dn = bits_f64(0xfff8000000000001ull);
    uint16_t gotn = 0;
    float fn = 0;
    bmt_st_convert(&dn, BMT_ST_F64, &gotn, BMT_BF16, 1);
    bmt_st_convert(&dn, BMT_ST_F64, &fn, BMT_F32, 1);
    ok(bf16_isnan(gotn) && (gotn >> 15) == 1 && isnan(fn), "convert: f64 NaN -> bf16 and f32 NaN");

    /* Random f64 over the whole bf16 range (subnormals and overflow included),
     * many of them near ties; -> bf16 and -> f32 against the reference. */
    double *rd = malloc(R * sizeof(*rd));
    for (int i = 0; i < R; i++) {
        int e = (int)(rnd64() % 280) - 150; /* 2^-150 .. 2^129 */
        double m = 1.0 + (double)(rnd64() >> 11) * 0x1p-53;
        if (i % 2) /* a bf16 tie, nudged by a few f64 ulps */
            m = 1.0 + (double)(rnd64() % 128) * 0x1p-7 + 0x1p-8 +
                (double)((int)(rnd64() % 9) - 4) * 0x1p-52;
        rd[i] = ldexp(rnd64() & 1 ? -m : m, e);
    }
    bmt_st_convert(rd, BMT_ST_F64, rb, BMT_BF16, R);
    bmt_st_convert(rd, BMT_ST_F64, rf, BMT_F32, R);
    int wrongb = 0, wrongf = 0;
    for (int i = 0; i < R; i++) {
        wrongb += rb[i] != bf16_of_value(ref_bf16_value(rd[i]));
        float want = (float)ref_f32_value(rd[i]);
        wrongf += f32_bits(rf[i]) != f32_bits(want);
    }
    is_int(wrongb, 0, "convert: f64 -> bf16 of 2^20 random values (half near ties) = reference");
    is_int(wrongf, 0, "convert: f64 -> f32 of the same = reference");
    /* f32 -> f64 is exact; f64 -> f64 a copy. */
    bmt_st_convert(rf, BMT_ST_F32, rd, BMT_F64, 1000);
    bool exact = true;
    for (int i = 0; i < 1000; i++)
        exact &= rd[i] == (double)rf[i];
    ok(exact, "convert: f32 -> f64 exact");
    uint64_t x = 0x0123456789abcdefull, y = 0;
    bmt_st_convert(&x, BMT_ST_F64, &y, BMT_F64, 1);
    ok(x == y, "convert: f64 -> f64 copies the bits");

    /* Unaligned source and destination. */
    unsigned char src[1 + 8], dst[1 + 8];
    float one = 1.5f;
    memcpy(src + 1, &one, 4);
    ok(bmt_st_convert(src + 1, BMT_ST_F32, dst + 1, BMT_F64, 1) == 0 &&
           memcmp(dst + 1, &(double){ 1.5 }, 8) == 0,
       "convert: unaligned src and dst");
    ok(bmt_st_convert(src, BMT_ST_I64, dst, BMT_F32, 1) == -1 &&
           bmt_st_convert(src, BMT_ST_F32, dst, BMT_DTYPE_COUNT, 1) == -1 &&
           bmt_st_convert(src, BMT_ST_U8, dst, BMT_BF16, 1) == -1,
       "convert: integer sources and unknown destinations are refused");
    free(h);
    free(b);
    free(f);
    free(d);
    free(rf);
    free(rb);
    free(rd);
}

/* ------------------------------------------------------------ file checks */

/* Bytes this process has read (read/pread of any file): /proc/self/io rchar. A
 * sample counts itself only after it was taken, so io_delta subtracts the bytes
 * of the sample io_start took. */
static long long io_base, io_self;
static bool io_ok;

static long long io_rchar(long long *self)
{
    int fd = open("/proc/self/io", O_RDONLY);
    if (fd < 0)
        return -1;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    *self = n;
    const char *r = strstr(buf, "rchar: ");
    return r ? atoll(r + 7) : -1;
}

static void io_start(void) { io_base = io_rchar(&io_self); }

static long long io_delta(void)
{
    long long self;
    long long now = io_rchar(&self);
    return now - io_base - io_self;
}

typedef struct opened {
    char path[512];
    bmt_st_t *st;
} opened_t;

static opened_t handles[16];
static int nhandles;

static bmt_st_t *handle(const char *path)
{
    for (int i = 0; i < nhandles; i++)
        if (strcmp(handles[i].path, path) == 0)
            return handles[i].st;
    return NULL;
}

/* count elements of size sz from file path, starting at element first. */
static void *load_slice(const char *path, int64_t first, int64_t count, size_t sz)
{
    FILE *f = fopen(path, "rb");
    void *buf = malloc((size_t)(count ? count : 1) * sz);
    bool good = f && fseek(f, (long)(first * (int64_t)sz), SEEK_SET) == 0 &&
                fread(buf, sz, (size_t)count, f) == (size_t)count;
    if (f)
        fclose(f);
    if (!good) {
        free(buf);
        return NULL;
    }
    return buf;
}

static bool exists(const char *path) { return access(path, R_OK) == 0; }

static bool copy_file(const char *dir, const char *rel, const char *to)
{
    char from[1024];
    snprintf(from, sizeof(from), "%s/%s", dir, rel);
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    bool good = in && out;
    char buf[65536];
    size_t n;
    while (good && (n = fread(buf, 1, sizeof(buf), in)) > 0)
        good = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        good = false;
    return good;
}

/* One read row: elements [first, first + count) of name into f32, bf16 and f64,
 * each compared element by element with the expected files, and the bytes taken
 * from the file counted. */
static void check_read(const char *dir, const char *path, const char *name, int64_t first,
                       int64_t count, const char *expect)
{
    bmt_st_t *st = handle(path);
    int i = bmt_st_find(st, name);
    const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
    if (!ok(t != NULL, "read %s %s: tensor listed", path, name))
        return;
    char e32[1024], e16[1024], e64[1024];
    snprintf(e32, sizeof(e32), "%s/%s.f32", dir, expect);
    snprintf(e16, sizeof(e16), "%s/%s.bf16", dir, expect);
    snprintf(e64, sizeof(e64), "%s/%s.f64", dir, expect);
    float *w32 = load_slice(e32, first, count, 4);
    uint16_t *w16 = load_slice(e16, first, count, 2);
    double *w64 = exists(e64) ? load_slice(e64, first, count, 8) : NULL;
    if (!ok(w32 && w16 && (w64 || !exists(e64)), "read %s [%lld, +%lld): expected values loaded",
            name, (long long)first, (long long)count)) {
        free(w32);
        free(w16);
        free(w64);
        return;
    }
    size_t n = (size_t)count;
    float *g32 = malloc((n ? n : 1) * 4);
    uint16_t *g16 = malloc((n ? n : 1) * 2);
    double *g64 = malloc((n ? n : 1) * 8);
    bmt_error_t err = { { 0 } };
    static const bmt_dtype_t dts[3] = { BMT_F32, BMT_BF16, BMT_F64 };
    void *dst[3] = { g32, g16, g64 };
    for (int k = 0; k < 3; k++) {
        io_start();
        int rc = bmt_st_read(st, i, first, count, dst[k], dts[k], &err);
        long long took = io_delta();
        size_t bad = 0, firstbad = n;
        for (size_t j = 0; rc == 0 && j < n; j++) {
            bool same;
            if (k == 0)
                same = f32_bits(g32[j]) == f32_bits(w32[j]) || (isnan(g32[j]) && isnan(w32[j]));
            else if (k == 1)
                same = g16[j] == w16[j] || (bf16_isnan(g16[j]) && bf16_isnan(w16[j]));
            else {
                double want = w64 ? w64[j] : (double)w32[j]; /* f32 -> f64 is exact */
                same = memcmp(&g64[j], &want, 8) == 0 || (isnan(g64[j]) && isnan(want));
            }
            if (!same && bad++ == 0)
                firstbad = j;
        }
        ok(rc == 0 && bad == 0, "read %s %s [%lld, +%lld) %s -> %s: every element matches", path,
           name, (long long)first, (long long)count, bmt_st_dtype_name(t->dtype),
           bmt_dtype_name(dts[k]));
        if (rc != 0)
            diag("error: %s", err.text);
        else if (bad)
            diag("%zu wrong, first at element %lld", bad, (long long)(first + (int64_t)firstbad));
        if (io_ok)
            ok(took == count * (long long)bmt_st_dtype_size(t->dtype),
               "read %s: took exactly %lld bytes from the file (%lld)", name,
               (long long)(count * (long long)bmt_st_dtype_size(t->dtype)), took);
    }
    free(w32);
    free(w16);
    free(w64);
    free(g32);
    free(g16);
    free(g64);
}

/* Split a tab-separated line in place; returns the number of fields. */
static int fields(char *line, char **f, int max)
{
    int n = 0;
    line[strcspn(line, "\n")] = '\0';
    for (char *c = line; n < max;) {
        f[n++] = c;
        char *t = strchr(c, '\t');
        if (t == NULL)
            break;
        *t = '\0';
        c = t + 1;
    }
    return n;
}

static void test_files(const char *dir)
{
    /* Jansson reads /dev/urandom once, to seed its hashes: let that happen
     * before any byte is counted. */
    bmt_st_close(bmt_st_parse("{}", 2, 0, "seed", NULL));
    long long self;
    io_start();
    io_ok = io_rchar(&self) >= 0 && io_delta() == self; /* nothing but one sample read */
    if (!io_ok)
        diag("/proc/self/io is not usable here: byte counts not checked");
    char path[1024];
    snprintf(path, sizeof(path), "%s/cases.tsv", dir);
    FILE *f = fopen(path, "r");
    if (!ok(f != NULL, "files: %s opens", path))
        return;
    char line[2048], *a[8];
    int rows = 0;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        int n = fields(line, a, 8);
        char full[1024];
        snprintf(full, sizeof(full), "%s/%s", dir, n > 1 ? a[1] : "");
        bmt_error_t err = { { 0 } };
        rows++;
        if (strcmp(a[0], "open") == 0 && n == 4) { /* open PATH COUNT BYTES */
            io_start();
            bmt_st_t *st = bmt_st_open(full, &err);
            long long took = io_delta();
            if (!ok(st != NULL && nhandles < 16, "open %s", a[1])) {
                diag("%s", err.text);
                continue;
            }
            snprintf(handles[nhandles].path, sizeof(handles[0].path), "%s", a[1]);
            handles[nhandles++].st = st;
            is_int(bmt_st_count(st), atoi(a[2]), "open: tensor count");
            if (io_ok)
                is_int(took, atoll(a[3]),
                       "open: read exactly the headers (8 + N per file, the index)");
        } else if (strcmp(a[0], "tensor") == 0 &&
                   n == 8) { /* tensor PATH NAME DTYPE SHAPE FILE OFFSET NBYTES */
            const bmt_st_tensor_t *t = bmt_st_tensor(handle(a[1]), bmt_st_find(handle(a[1]), a[2]));
            char shape[256] = "";
            size_t used = 0;
            for (int d = 0; t && d < t->ndim; d++)
                used += (size_t)snprintf(shape + used, sizeof(shape) - used, "%s%lld", d ? "x" : "",
                                         (long long)t->shape[d]);
            const char *base = t ? strrchr(t->file, '/') : NULL;
            base = base ? base + 1 : t ? t->file : "";
            ok(t && strcmp(bmt_st_dtype_name(t->dtype), a[3]) == 0 && strcmp(shape, a[4]) == 0 &&
                   strcmp(base, a[5]) == 0 && t->offset == atoll(a[6]) && t->nbytes == atoll(a[7]),
               "tensor %s %s: %s [%s] in %s at %s, %s bytes", a[1], a[2], a[3], a[4], a[5], a[6],
               a[7]);
        } else if (strcmp(a[0], "meta") == 0 && n == 4) { /* meta PATH KEY VALUE */
            is_str(bmt_st_metadata(handle(a[1]), a[2]), a[3], "metadata value");
        } else if (strcmp(a[0], "plan") == 0 && n == 3) { /* plan PATH SUMMARY */
            bmt_st_plan_t *plan = NULL;
            char sum[1024] = "";
            int rc = bmt_st_discover(handle(a[1]), &plan, &err);
            bool consistent = rc == 0 && summarize(handle(a[1]), plan, sum, sizeof(sum));
            ok(consistent, "plan %s: consistent", a[1]);
            is_str(rc == 0 ? sum : err.text, a[2], "plan: blocks in model order");
            bmt_st_plan_free(plan);
        } else if (strcmp(a[0], "read") == 0 && n == 6) { /* read PATH NAME FIRST COUNT EXPECT */
            check_read(dir, a[1], a[2], atoll(a[3]), atoll(a[4]), a[5]);
        } else if (strcmp(a[0], "truncread") == 0 && n == 4) { /* truncread PATH NAME ERROR */
            /* on a copy (same name, in a directory of its own): DIR stays reusable */
            char tmpdir[] = "/tmp/bmt-st.XXXXXX";
            const char *slash = strrchr(a[1], '/');
            bool copied =
                mkdtemp(tmpdir) != NULL &&
                snprintf(full, sizeof(full), "%s/%s", tmpdir, slash ? slash + 1 : a[1]) > 0 &&
                copy_file(dir, a[1], full);
            bmt_st_t *st = copied ? bmt_st_open(full, &err) : NULL;
            int i = bmt_st_find(st, a[2]);
            const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
            if (!ok(t != NULL, "truncread: a copy of %s opens", a[1])) {
                diag("%s", copied ? err.text : strerror(errno));
                bmt_st_close(st);
                if (copied)
                    unlink(full);
                rmdir(tmpdir);
                continue;
            }
            int rc = truncate(full, t->offset + t->nbytes / 2);
            float *buf = malloc((size_t)t->numel * 4);
            int rr = bmt_st_read(st, i, 0, t->numel, buf, BMT_F32, &err);
            ok(rc == 0 && rr == -1, "truncread: reading %s of a file truncated after open fails",
               a[2]);
            is_str(err.text, a[3], "truncread: the error names file, tensor and bytes");
            free(buf);
            bmt_st_close(st);
            unlink(full);
            rmdir(tmpdir);
        } else {
            ok(0, "cases.tsv: unknown row '%s' with %d fields", a[0], n);
        }
    }
    fclose(f);
    ok(rows > 0, "files: %d rows of cases.tsv checked", rows);
    for (int i = 0; i < nhandles; i++)
        bmt_st_close(handles[i].st);
}

/* ------------------------------------------------------------ tools for the shell test */

static int list(const char *path)
{
    bmt_error_t err = { { 0 } };
    bmt_st_t *st = bmt_st_open(path, &err);
    if (st == NULL) {
        fprintf(stderr, "%s\n", err.text);
        return 1;
    }
    printf("%d tensors\n", bmt_st_count(st));
    for (int i = 0; i < bmt_st_count(st); i++) {
        const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
        char shape[256];
        size_t used = (size_t)snprintf(shape, sizeof(shape), "[");
        for (int d = 0; d < t->ndim; d++)
            used += (size_t)snprintf(shape + used, sizeof(shape) - used, "%s%lld", d ? ", " : "",
                                     (long long)t->shape[d]);
        snprintf(shape + used, sizeof(shape) - used, "]");
        const char *base = strrchr(t->file, '/');
        printf("%s %s %s %s %lld %lld\n", t->name, bmt_st_dtype_name(t->dtype), shape,
               base ? base + 1 : t->file, (long long)t->offset, (long long)t->nbytes);
    }
    bmt_st_plan_t *plan = NULL;
    int rc = 0;
    if (bmt_st_discover(st, &plan, &err) < 0) {
        fprintf(stderr, "%s\n", err.text);
        rc = 2;
    } else {
        char sum[4096];
        summarize(st, plan, sum, sizeof(sum));
        printf("plan: %s\n", sum);
    }
    bmt_st_plan_free(plan);
    bmt_st_close(st);
    return rc;
}

static int read_tool(const char *path, const char *name, const char *first, const char *count)
{
    bmt_error_t err = { { 0 } };
    bmt_st_t *st = bmt_st_open(path, &err);
    int rc = 1;
    if (st != NULL) {
        int64_t n = atoll(count);
        float *buf = malloc((size_t)(n > 0 ? n : 1) * 4);
        int i = bmt_st_find(st, name);
        if (i < 0)
            snprintf(err.text, sizeof(err.text), "no tensor '%s'", name);
        else if (bmt_st_read(st, i, atoll(first), n, buf, BMT_F32, &err) == 0) {
            for (int64_t k = 0; k < n; k++)
                printf("%.9g\n", buf[k]);
            rc = 0;
        }
        free(buf);
        bmt_st_close(st);
    }
    if (rc)
        fprintf(stderr, "%s\n", err.text);
    return rc;
}

/* ------------------------------------------------------------ checksums */

/* A file of two tensors: "a" BF16 (7) then "b" F32 (100), so b starts at byte
 * 14 of the data section, not on a multiple of 4; units of `unit` bytes cut at
 * multiples of it from the data section's start cut through elements. */
static void test_checksums(void)
{
    char dir[] = "/tmp/bmt-sums.XXXXXX", path[64];
    if (mkdtemp(dir) == NULL) {
        ok(0, "checksums: mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(path, sizeof(path), "%s/m.safetensors", dir);
    const char *hdr = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[7],\"data_offsets\":[0,14]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[14,414]}}";
    size_t hl = strlen(hdr), pad = (hl + 7) / 8 * 8, data = 414, size = 8 + pad + data;
    unsigned char *file = calloc(1, size);
    for (int i = 0; i < 8; i++)
        file[i] = (unsigned char)((uint64_t)pad >> (8 * i));
    memcpy(file + 8, hdr, hl);
    memset(file + 8 + hl, ' ', pad - hl);
    unsigned char *d = file + 8 + pad;
    for (int i = 0; i < 7; i++) {
        uint16_t h = bf16_of_value(0.25 * (i + 1));
        memcpy(d + 2 * i, &h, 2);
    }
    for (int i = 0; i < 100; i++) {
        float f = (float)(i * 1.5 - 20.125);
        memcpy(d + 14 + 4 * i, &f, 4);
    }
    FILE *fh = fopen(path, "wb");
    ok(fh && fwrite(file, 1, size, fh) == size && fclose(fh) == 0, "checksums: wrote %s", path);
    const uint64_t start = 8 + pad, hh = bmt_st_checksum(file, start);
    bmt_error_t err;
    bmt_st_t *plain = bmt_st_open(path, &err), *st = bmt_st_open(path, &err);
    const int ia = bmt_st_find(plain, "a"), ib = bmt_st_find(plain, "b");
    ok(plain && st && ia >= 0 && ib >= 0, "checksums: opened twice");
    const uint64_t units[] = { 1, 3, 10, 64, 1000 };
    for (size_t k = 0; plain && st && k < sizeof(units) / sizeof(units[0]); k++) {
        const uint64_t u = units[k];
        bmt_st_sum_t sums[512];
        size_t n = 0;
        for (uint64_t at = 0; at < data; at += u)
            sums[n++] = (bmt_st_sum_t){ start + at, at + u <= data ? u : data - at,
                                        bmt_st_checksum(d + at, at + u <= data ? u : data - at) };
        ok(bmt_st_set_checksums(st, "m.safetensors", hh, sums, n, &err) == 0,
           "checksums: %zu units of %llu bytes attached (%s)", n, (unsigned long long)u, err.text);
        /* every range of b and a, in every destination dtype, as unchecked */
        const struct {
            int t, first, count;
        } rr[] = { { ib, 0, 100 }, { ib, 3, 57 }, { ib, 99, 1 }, { ia, 0, 7 }, { ia, 1, 5 } };
        const bmt_dtype_t dts[] = { BMT_F32, BMT_BF16, BMT_F64 };
        bool same = true;
        for (size_t r = 0; r < sizeof(rr) / sizeof(rr[0]); r++)
            for (size_t q = 0; q < 3; q++) {
                unsigned char x[800], y[800];
                memset(x, 0xaa, sizeof(x));
                memset(y, 0x55, sizeof(y));
                int a1 = bmt_st_read(plain, rr[r].t, rr[r].first, rr[r].count, x, dts[q], &err);
                int a2 = bmt_st_read(st, rr[r].t, rr[r].first, rr[r].count, y, dts[q], &err);
                size_t nb = (size_t)rr[r].count * bmt_dtype_size(dts[q]);
                if (a1 != 0 || a2 != 0 || memcmp(x, y, nb) != 0) {
                    same = false;
                    diag("unit %llu, tensor %d [%d, +%d) as %s: %d %d %s", (unsigned long long)u,
                         rr[r].t, rr[r].first, rr[r].count, bmt_dtype_name(dts[q]), a1, a2,
                         err.text);
                }
            }
        ok(same,
           "checksums: units of %llu bytes: every read the same as unchecked, in f32, bf16 "
           "and f64",
           (unsigned long long)u);
        uint64_t bytes = 0;
        const int vrc = bmt_st_verify(st, &bytes, &err);
        ok(vrc == 0 && bytes == data,
           "checksums: units of %llu bytes: bmt_st_verify reads %llu bytes", (unsigned long long)u,
           (unsigned long long)bytes);
    }
    /* Expected failures, each leaving the handle as it was. */
    bmt_st_sum_t whole = { start, data, bmt_st_checksum(d, data) };
    bmt_st_sum_t holes[2] = { { start, 100, bmt_st_checksum(d, 100) },
                              { start + 101, data - 101, bmt_st_checksum(d + 101, data - 101) } };
    bmt_st_sum_t shortv = { start, data - 1, bmt_st_checksum(d, data - 1) };
    ok(st && bmt_st_set_checksums(st, "m.safetensors", hh ^ 1, &whole, 1, &err) < 0 &&
           strstr(err.text, "m.safetensors: checksum mismatch in its header, bytes [0, ") != NULL,
       "checksums: a header hash that differs is refused (%s)", err.text);
    ok(st && bmt_st_set_checksums(st, "m.safetensors", hh, holes, 2, &err) < 0 &&
           strstr(err.text, "do not tile its data section") != NULL,
       "checksums: units with a gap are refused (%s)", err.text);
    ok(st && bmt_st_set_checksums(st, "m.safetensors", hh, &shortv, 1, &err) < 0 &&
           strstr(err.text, "longer than when it was written") != NULL,
       "checksums: units that stop short of the file's end are refused (%s)", err.text);
    ok(st && bmt_st_set_checksums(st, "other.safetensors", hh, &whole, 1, &err) < 0 &&
           strstr(err.text, "no file 'other.safetensors'") != NULL,
       "checksums: an unknown file is refused (%s)", err.text);
    /* A flipped bit in b's element 40: reads that cover it fail, naming file,
     * tensor and bytes; reads that do not still work; so does verify fail. */
    bmt_st_sum_t sums[64];
    size_t n = 0;
    for (uint64_t at = 0; at < data; at += 64) {
        const uint64_t len = at + 64 <= data ? 64 : data - at;
        sums[n++] = (bmt_st_sum_t){ start + at, len, bmt_st_checksum(d + at, (size_t)len) };
    }
    int fd = open(path, O_WRONLY);
    unsigned char flipped = d[14 + 4 * 40] ^ 1;
    ok(fd >= 0 && pwrite(fd, &flipped, 1, (off_t)(start + 14 + 4 * 40)) == 1 && close(fd) == 0,
       "checksums: flipped a bit of b[40] in the file");
    bmt_st_t *st2 = bmt_st_open(path, &err);
    double v[100];
    err.text[0] = '\0';
    ok(st2 && bmt_st_set_checksums(st2, path, hh, sums, n, &err) == 0,
       "checksums: attached by path (%s)", err.text);
    ok(st2 && bmt_st_read(st2, ib, 30, 20, v, BMT_F32, &err) < 0 &&
           strstr(err.text, "m.safetensors: tensor 'b': checksum mismatch in bytes [") != NULL &&
           strstr(err.text, "the file is damaged") != NULL,
       "checksums: a read over the flipped bit fails: %s", err.text);
    ok(st2 && bmt_st_read(st2, ib, 30, 20, v, BMT_F64, &err) < 0,
       "checksums: and as f64 (the converting path) too");
    ok(st2 && bmt_st_read(st2, ib, 80, 20, v, BMT_F64, &err) == 0 && v[0] == 80 * 1.5 - 20.125,
       "checksums: a read of other units still works");
    ok(st2 && bmt_st_verify(st2, NULL, &err) < 0 && strstr(err.text, "tensor 'b'") != NULL,
       "checksums: bmt_st_verify fails naming the tensor (%s)", err.text);
    bmt_st_close(st2);
    bmt_st_close(st);
    bmt_st_close(plain);
    free(file);
    unlink(path);
    rmdir(dir);
}

/* ------------------------------------------------------------ --ckpt */

static int ckpt_nop(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    (void)model, (void)call, (void)err;
    return 0;
}

static int ckpt_tool(int argc, char **argv)
{
    static const bmt_block_ops_t ops = { ckpt_nop, ckpt_nop };
    if (argc < 4)
        return 2;
    const char *mode = argv[2], *dir = argv[3], *name = "ck";
    bool bf16 = false, optim = true;
    int a = 4;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (strcmp(argv[a], "--name") == 0 && a + 1 < argc)
            name = argv[++a];
        else if (strcmp(argv[a], "--bf16") == 0)
            bf16 = true;
        else if (strcmp(argv[a], "--no-optim") == 0)
            optim = false;
        else
            return 2;
    }
    bmt_ctx_t *ctx;
    bmt_error_t err = { { 0 } };
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "%s\n", err.text);
        return 1;
    }
    bmt_blocklist_t *l = bmt_blocklist_create(ctx, NULL, &err);
    bmt_block_t *blocks[16];
    int nb = 0, rc = 0;
    for (; l && a < argc && nb < 16 && rc == 0; a++) {
        char *spec = strdup(argv[a]), *colon = strchr(spec, ':');
        if (colon)
            *colon = '\0';
        int64_t shape[1] = { 4 };
        bmt_block_t *b = bmt_block_create(ctx, spec, &err);
        /* another seed per block and per mode: what a load gets is the file's */
        const uint64_t seed = (strcmp(mode, "load") == 0 ? 1000 : 1) + (uint64_t)nb;
        if (b == NULL ||
            bmt_block_add_param(b, colon ? colon + 1 : "w", 1, shape, bf16 ? BMT_BF16 : BMT_F32,
                                (bmt_init_t)BMT_INIT_NORMAL_V(0, 1), 0, &err) < 0 ||
            bmt_block_build(b, seed, &err) < 0 ||
            bmt_blocklist_append(l, b, &ops, NULL, &err) < 0) {
            bmt_block_destroy(b); /* not the list's: nothing else frees it */
            rc = -1;
        } else
            blocks[nb++] = b;
        free(spec);
    }
    /* every way out frees what it made (a sanitizer build counts a leak as a
     * failure, whatever the exit status was to say) */
    int code = 0;
    bmt_optim_t *o = l && rc == 0 && optim ? bmt_adamw_create(l, NULL, &err) : NULL;
    if (l == NULL || rc < 0 || (optim && o == NULL)) {
        fprintf(stderr, "ckpt: building the model: %s\n", err.text);
        code = 1;
        goto out;
    }
    if (strcmp(mode, "save") == 0) {
        rc = bmt_ckpt_save(l, o, dir, name, NULL, 0, &err);
    } else if (strcmp(mode, "load") == 0) {
        rc = bmt_ckpt_load(l, o, dir, NULL, &err);
    } else if (strcmp(mode, "async2") == 0) {
        bmt_ckpt_pending_t *p1 = NULL, *p2 = NULL;
        bmt_error_t e2 = { { 0 } };
        rc = bmt_ckpt_save_async(l, o, dir, name, NULL, 0, &p1, &err);
        int rc2 = rc == 0 ? bmt_ckpt_save_async(l, o, dir, name, NULL, 0, &p2, &e2) : 0;
        if (rc == 0)
            rc = bmt_ckpt_finish(p1, &err);
        if (bmt_ckpt_finish(p2, rc2 < 0 ? NULL : &e2) < 0 || rc2 < 0) {
            if (rc == 0)
                err = e2;
            rc = -1;
        }
    } else {
        code = 2;
        goto out;
    }
    if (rc < 0) {
        printf("ckpt: refused: %s\n", err.text);
        code = 3;
        goto out;
    }
    for (int k = 0; k < nb; k++) {
        if (bmt_block_gather(blocks[k], &err) < 0) {
            fprintf(stderr, "ckpt: gather: %s\n", err.text);
            code = 1;
            goto out;
        }
        double v[4];
        for (int i = 0; i < 4; i++)
            v[i] = bf16 ? bf16_value(((const uint16_t *)bmt_block_param(blocks[k], 0))[i])
                        : ((const float *)bmt_block_param(blocks[k], 0))[i];
        printf("ckpt: %s = %.9g %.9g %.9g %.9g\n", bmt_block_param_name(blocks[k], 0), v[0], v[1],
               v[2], v[3]);
        bmt_block_release(blocks[k], &err);
    }
out:
    bmt_optim_destroy(o);
    bmt_blocklist_destroy(l);
    bmt_finalize(ctx);
    return code;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "--ckpt") == 0) {
        int rc = ckpt_tool(argc, argv);
        if (rc == 2)
            fprintf(stderr,
                    "usage: %s --ckpt save|load|async2 DIR [--name N] [--bf16] "
                    "[--no-optim] BLOCK[:PARAM]...\n",
                    argv[0]);
        return rc;
    }
    if (argc == 3 && strcmp(argv[1], "--open") == 0)
        return list(argv[2]);
    if (argc == 6 && strcmp(argv[1], "--read") == 0)
        return read_tool(argv[2], argv[3], argv[4], argv[5]);
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: %s [DIR] | --open PATH | --read PATH NAME FIRST COUNT\n", argv[0]);
        return 2;
    }
    test_headers();
    test_listing();
    test_index();
    test_discover();
    test_convert();
    test_checksums();
    if (argc == 2)
        test_files(argv[1]);
    return done_testing();
}
