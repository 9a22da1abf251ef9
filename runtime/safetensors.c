/* runtime/safetensors.c — safetensors headers, byte-range reads, block discovery.
 *
 * Open reads 8 bytes and the header of each file with pread, parses the header
 * with Jansson (duplicate keys refused) and checks everything the format and
 * the reference library require before a handle exists: dtype, shape (at most
 * BMT_ST_MAX_DIMS, no overflow), data_offsets that hold exactly shape x dtype
 * bytes, and tensors that tile the data section with no hole, overlap or tail.
 * The header is freed right after parsing: a handle keeps one entry per tensor
 * (name, dtype, shape, byte range, file) and an open descriptor per file, so
 * memory is O(header) whatever the size of the data. An index runs the same
 * code whether its files' headers come from the files (bmt_st_open) or from
 * memory (bmt_st_parse_index, which tests/fuzz/st_index.c drives): a load
 * function fetches each.
 *
 * bmt_st_read turns an element range into one byte range of one file and
 * preads exactly those bytes, straight into dst when no conversion is needed,
 * else through a bounce buffer of at most BMT_ST_CHUNK_BYTES. Conversions round
 * once to nearest even; f64 -> bf16 goes through f32 rounded to odd, which
 * (24 >= 8 + 2 significand bits) makes the final rounding the only one.
 *
 * Discovery is pure string work on the sorted names: a tensor of layer N
 * starts with "<stack>.<N>." where the stack's last component is h, layers,
 * layer, blocks or block. Names sorted by strcmp keep each layer's tensors
 * together and in relative-name order, so layers compare by a merge walk.
 */
#include "bmt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checksum.h"
#include "error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; bmt_st_read assumes a little-endian host"
#endif

/* ------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    unsigned size;
} dtypes[BMT_ST_DTYPE_COUNT] = {
    [BMT_ST_BOOL] = { "BOOL", 1 },       [BMT_ST_U8] = { "U8", 1 },
    [BMT_ST_I8] = { "I8", 1 },           [BMT_ST_F8_E5M2] = { "F8_E5M2", 1 },
    [BMT_ST_F8_E4M3] = { "F8_E4M3", 1 }, [BMT_ST_I16] = { "I16", 2 },
    [BMT_ST_U16] = { "U16", 2 },         [BMT_ST_F16] = { "F16", 2 },
    [BMT_ST_BF16] = { "BF16", 2 },       [BMT_ST_I32] = { "I32", 4 },
    [BMT_ST_U32] = { "U32", 4 },         [BMT_ST_F32] = { "F32", 4 },
    [BMT_ST_F64] = { "F64", 8 },         [BMT_ST_I64] = { "I64", 8 },
    [BMT_ST_U64] = { "U64", 8 },
};

const char *bmt_st_dtype_name(bmt_st_dtype_t dtype)
{
    return (unsigned)dtype < BMT_ST_DTYPE_COUNT ? dtypes[dtype].name : "invalid";
}

size_t bmt_st_dtype_size(bmt_st_dtype_t dtype)
{
    return (unsigned)dtype < BMT_ST_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

static int dtype_from_name(const char *name)
{
    for (int d = 0; d < BMT_ST_DTYPE_COUNT; d++)
        if (strcmp(dtypes[d].name, name) == 0)
            return d;
    return -1;
}

static bool convertible(bmt_st_dtype_t d)
{
    return d == BMT_ST_F32 || d == BMT_ST_F16 || d == BMT_ST_BF16 || d == BMT_ST_F64;
}

/* ------------------------------------------------------------ conversion */

/* f16 -> f32 is exact: normals rebias, subnormals (m x 2^-24) normalize, inf and
 * NaN keep sign and payload. */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        uint32_t e = 113; /* 2^-14 = the exponent of a subnormal's leading bit 0x400 */
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* f64 -> bf16 with one rounding: round to f32 "to odd" (truncate, then set the
 * last bit if anything was lost), then to bf16 to nearest even. */
static uint16_t f64_to_bf16(double d)
{
    float f = (float)d;
    if (d == d && (double)f != d) {
        uint32_t u;
        memcpy(&u, &f, sizeof(u));
        if ((double)f > d ? d >= 0 : d < 0) /* f rounded away from zero: step back */
            u -= 1;
        u |= 1u;
        memcpy(&f, &u, sizeof(f));
    }
    return bmt_f32_to_bf16(f);
}

/* Element i of src as float (exact for F32, F16, BF16; rounded for F64). */
static inline float load_f32(const unsigned char *src, bmt_st_dtype_t sdt, size_t i)
{
    switch (sdt) {
    case BMT_ST_F32: {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    case BMT_ST_F16: {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        return f16_to_f32(h);
    }
    case BMT_ST_BF16: {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        return bmt_bf16_to_f32(h);
    }
    default: {
        double d;
        memcpy(&d, src + 8 * i, 8);
        return (float)d;
    }
    }
}

int bmt_st_convert(const void *src_, bmt_st_dtype_t sdt, void *dst_, bmt_dtype_t ddt, size_t n)
{
    const unsigned char *src = src_;
    unsigned char *dst = dst_;
    if (!convertible(sdt) || bmt_dtype_size(ddt) == 0)
        return -1;
    if (ddt == BMT_F32) {
        for (size_t i = 0; i < n; i++) {
            float f = load_f32(src, sdt, i);
            memcpy(dst + 4 * i, &f, 4);
        }
    } else if (ddt == BMT_F64) {
        for (size_t i = 0; i < n; i++) {
            double d;
            if (sdt == BMT_ST_F64)
                memcpy(&d, src + 8 * i, 8);
            else
                d = (double)load_f32(src, sdt, i); /* exact */
            memcpy(dst + 8 * i, &d, 8);
        }
    } else { /* BMT_BF16 */
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            if (sdt == BMT_ST_BF16) {
                memcpy(&h, src + 2 * i, 2);
            } else if (sdt == BMT_ST_F64) {
                double d;
                memcpy(&d, src + 8 * i, 8);
                h = f64_to_bf16(d);
            } else {
                h = bmt_f32_to_bf16(load_f32(src, sdt, i)); /* f32, f16: exact, then one rounding */
            }
            memcpy(dst + 2 * i, &h, 2);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ the handle */

typedef struct entry {
    char *name;
    bmt_st_dtype_t dtype;
    int ndim;
    int64_t shape[BMT_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* data_offsets: bytes relative to the data section */
    int file;            /* index into st->files */
} entry_t;

typedef struct st_file {
    char *path;           /* as opened: the index's directory + the weight_map's name */
    const char *label;    /* what errors call it: the name without the directory */
    int fd;               /* -1 behind bmt_st_parse */
    uint64_t data_start;  /* 8 + header length */
    uint64_t data_len;    /* bytes of the data section */
    uint64_t header_hash; /* XXH3-64 of bytes [0, data_start), as read at open */
    bmt_st_sum_t *sums;   /* (nsums) by offset, tiling the data section; NULL: unchecked */
    size_t nsums;
} st_file_t;

typedef struct meta {
    char *key, *value;
} meta_t;

struct bmt_st {
    char *label;      /* the opened path's last component: discovery errors */
    st_file_t *files; /* (nfiles) */
    int nfiles;
    entry_t *ent; /* (count) sorted by name once complete */
    int count, cap;
    bmt_st_tensor_t *tensors; /* (count) the public view of ent */
    meta_t *meta;             /* (nmeta) first key wins */
    int nmeta, metacap;
};

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

void bmt_st_close(bmt_st_t *st)
{
    if (st == NULL)
        return;
    for (int f = 0; f < st->nfiles; f++) {
        if (st->files[f].fd >= 0)
            close(st->files[f].fd);
        free(st->files[f].path);
        free(st->files[f].sums);
    }
    for (int i = 0; i < st->count; i++)
        free(st->ent[i].name);
    for (int i = 0; i < st->nmeta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->files);
    free(st->ent);
    free(st->tensors);
    free(st->meta);
    free(st->label);
    free(st);
}

static bmt_st_t *st_new(const char *path, int nfiles, bmt_error_t *err)
{
    bmt_st_t *st = calloc(1, sizeof(*st));
    if (st && (st->label = strdup(base_name(path))) != NULL &&
        (st->files = calloc((size_t)(nfiles ? nfiles : 1), sizeof(*st->files))) != NULL) {
        for (int f = 0; f < nfiles; f++)
            st->files[f].fd = -1;
        st->nfiles = nfiles;
        return st;
    }
    bmt_st_close(st);
    errprintf(err, "%.1200s: out of memory", path);
    return NULL;
}

static const char *meta_get(const bmt_st_t *st, const char *key)
{
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[i].key, key) == 0)
            return st->meta[i].value;
    return NULL;
}

/* Appended in the order read; meta_get's scan from the start makes the first
 * one win. No duplicate check here: with it, a header of 100,000 metadata keys
 * took 27 s to open (quadratic), found while fuzzing. */
static int meta_add(bmt_st_t *st, const char *key, const char *value, const char *label,
                    bmt_error_t *err)
{
    if (st->nmeta == st->metacap) {
        int cap = st->metacap ? 2 * st->metacap : 8;
        meta_t *m = realloc(st->meta, (size_t)cap * sizeof(*m));
        if (m == NULL)
            return errprintf(err, "%.900s: out of memory", label);
        st->meta = m;
        st->metacap = cap;
    }
    meta_t *m = &st->meta[st->nmeta];
    m->key = strdup(key);
    m->value = strdup(value);
    if (!m->key || !m->value) {
        free(m->key);
        free(m->value);
        return errprintf(err, "%.900s: out of memory", label);
    }
    st->nmeta++;
    return 0;
}

/* "[768, 2304]" into buf. */
static const char *shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && used < len; d++)
        used +=
            (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

/* "<file>: tensor '<name>': <cause>"; returns -1. */
static int tensor_err(bmt_error_t *err, const char *file, const char *name, const char *fmt, ...)
    BMT_PRINTF(4, 5);
static int tensor_err(bmt_error_t *err, const char *file, const char *name, const char *fmt, ...)
{
    if (err == NULL)
        return -1;
    char cause[sizeof(err->text)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof(cause), fmt, ap);
    va_end(ap);
    return errprintf(err, "%.900s: tensor '%.900s': %s", file, name, cause);
}

/* Errors are one printable line (bmt/error.h), yet they quote the file: a
 * tensor name may hold any character JSON can escape ("a\nb"), and Jansson's
 * messages quote the raw bytes near a syntax error, newlines included (found
 * by tests/fuzz/st_header.c). Every public function passes its error through
 * here, so a crafted header cannot add lines to a log. Returns -1. */
static int one_line(bmt_error_t *err)
{
    if (err != NULL)
        for (char *c = err->text; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
    return -1;
}

/* ------------------------------------------------------------ header parsing */

static bool get_uint(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* One tensor entry of a header: checked on its own (the tiling is checked over
 * the whole file afterwards) and appended to st->ent. */
static int parse_tensor(bmt_st_t *st, const char *name, json_t *v, uint64_t data_len, int file,
                        bmt_error_t *err)
{
    const char *label = st->files[file].label;
    if (!json_is_object(v))
        return tensor_err(err, label, name, "entry is not an object");
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (jd == NULL)
        return tensor_err(err, label, name, "dtype is missing");
    if (!json_is_string(jd))
        return tensor_err(err, label, name, "dtype is not a string");
    int dt = dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return tensor_err(err, label, name, "unknown dtype '%.16s'", json_string_value(jd));
    if (js == NULL)
        return tensor_err(err, label, name, "shape is missing");
    if (!json_is_array(js))
        return tensor_err(err, label, name, "shape is not an array");
    size_t ndim = json_array_size(js);
    if (ndim > BMT_ST_MAX_DIMS)
        return tensor_err(err, label, name, "shape has %zu dimensions (at most %d)", ndim,
                          BMT_ST_MAX_DIMS);
    entry_t e = { .dtype = (bmt_st_dtype_t)dt, .ndim = (int)ndim, .numel = 1, .file = file };
    bool overflow = false;
    for (size_t d = 0; d < ndim; d++) {
        uint64_t dim;
        if (!get_uint(json_array_get(js, d), &dim))
            return tensor_err(err, label, name, "shape[%zu] is not a non-negative integer", d);
        e.shape[d] = (int64_t)dim;
        if (dim != 0 && (uint64_t)e.numel > (uint64_t)INT64_MAX / dim)
            overflow = true;
        else
            e.numel *= (int64_t)dim;
    }
    char sh[64];
    uint64_t size = dtypes[dt].size;
    if (overflow || (uint64_t)e.numel > (uint64_t)INT64_MAX / size)
        return tensor_err(err, label, name, "shape %s of %s is more than 2^63 bytes",
                          shape_str(sh, sizeof(sh), e.ndim, e.shape), dtypes[dt].name);
    if (jo == NULL)
        return tensor_err(err, label, name, "data_offsets is missing");
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !get_uint(json_array_get(jo, 0), &e.begin) || !get_uint(json_array_get(jo, 1), &e.end))
        return tensor_err(err, label, name,
                          "data_offsets is not [begin, end] (two non-negative integers)");
    unsigned long long b = e.begin, en = e.end;
    if (e.end < e.begin)
        return tensor_err(err, label, name, "data_offsets [%llu, %llu] are not increasing", b, en);
    if (e.end > data_len)
        return tensor_err(err, label, name,
                          "data_offsets [%llu, %llu] run past the data section (%llu bytes)", b, en,
                          (unsigned long long)data_len);
    uint64_t need = (uint64_t)e.numel * size;
    if (e.end - e.begin != need)
        return tensor_err(err, label, name,
                          "data_offsets [%llu, %llu] hold %llu bytes; %s %s needs %llu", b, en,
                          en - b, dtypes[dt].name, shape_str(sh, sizeof(sh), e.ndim, e.shape),
                          (unsigned long long)need);
    if (st->count == st->cap) {
        int cap = st->cap ? 2 * st->cap : 64;
        entry_t *p = realloc(st->ent, (size_t)cap * sizeof(*p));
        if (p == NULL)
            return errprintf(err, "%.900s: out of memory", label);
        st->ent = p;
        st->cap = cap;
    }
    if ((e.name = strdup(name)) == NULL)
        return errprintf(err, "%.900s: out of memory", label);
    st->ent[st->count++] = e;
    return 0;
}

static int by_offsets(const void *a, const void *b)
{
    const entry_t *x = *(entry_t *const *)a, *y = *(entry_t *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The tensors of one file (st->ent[first..count)) must tile [0, data_len). */
static int check_tiling(bmt_st_t *st, int first, uint64_t data_len, const char *label,
                        bmt_error_t *err)
{
    int n = st->count - first;
    entry_t **v = malloc((size_t)(n ? n : 1) * sizeof(*v));
    if (v == NULL)
        return errprintf(err, "%.900s: out of memory", label);
    for (int i = 0; i < n; i++)
        v[i] = &st->ent[first + i];
    qsort(v, (size_t)n, sizeof(*v), by_offsets);
    uint64_t pos = 0;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (v[i]->begin < pos)
            rc = errprintf(
                err, "%.900s: tensors '%.900s' [%llu, %llu] and '%.900s' [%llu, %llu] overlap",
                label, v[i - 1]->name, (unsigned long long)v[i - 1]->begin,
                (unsigned long long)v[i - 1]->end, v[i]->name, (unsigned long long)v[i]->begin,
                (unsigned long long)v[i]->end);
        else if (v[i]->begin > pos)
            rc = errprintf(err,
                           "%.900s: bytes [%llu, %llu) of the data section belong to no tensor "
                           "(a hole before '%.900s')",
                           label, (unsigned long long)pos, (unsigned long long)v[i]->begin,
                           v[i]->name);
        pos = v[i]->end;
    }
    if (rc == 0 && pos != data_len)
        rc = errprintf(err,
                       "%.900s: bytes [%llu, %llu) at the end of the data section belong to no "
                       "tensor",
                       label, (unsigned long long)pos, (unsigned long long)data_len);
    free(v);
    return rc;
}

/* Parse and check one file's header (hdr: len bytes, not NUL-terminated) into st.
 * Pure: no I/O. */
static int parse_header(bmt_st_t *st, const char *hdr, size_t len, uint64_t data_len, int file,
                        bmt_error_t *err)
{
    const char *label = st->files[file].label;
    if (len == 0)
        return errprintf(err, "%.900s: header is empty, not a JSON object", label);
    if (hdr[0] != '{') {
        unsigned char c = (unsigned char)hdr[0];
        if (c >= 0x21 && c < 0x7f)
            return errprintf(err, "%.900s: header is not a JSON object (it starts with '%c')",
                             label, c);
        return errprintf(err, "%.900s: header is not a JSON object (it starts with byte 0x%02x)",
                         label, c);
    }
    json_error_t jerr;
    json_t *root = json_loadb(hdr, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return errprintf(err, "%.900s: header is not valid JSON: %.900s (at byte %d)", label,
                         jerr.text, jerr.position);
    int first = st->count, rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") != 0) {
            rc = parse_tensor(st, key, v, data_len, file, err);
        } else if (json_is_object(v)) {
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv)
            {
                if (!json_is_string(mv)) {
                    rc = errprintf(err, "%.900s: __metadata__ '%.900s' is not a string", label, mk);
                    break;
                }
                if ((rc = meta_add(st, mk, json_string_value(mv), label, err)) < 0)
                    break;
            }
        } else if (!json_is_null(v)) {
            rc = errprintf(err, "%.900s: __metadata__ is not an object of strings", label);
        }
        if (rc < 0)
            break;
    }
    json_decref(root);
    if (rc == 0)
        rc = check_tiling(st, first, data_len, label, err);
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const entry_t *)a)->name, ((const entry_t *)b)->name);
}

/* Sort every file's tensors into one list and build the public views. Across
 * files (an index) a name may appear once. */
static int finish(bmt_st_t *st, bmt_error_t *err)
{
    if (st->count > 1)
        qsort(st->ent, (size_t)st->count, sizeof(*st->ent), by_name);
    for (int i = 1; i < st->count; i++) {
        if (strcmp(st->ent[i - 1].name, st->ent[i].name) == 0) {
            int f1 = st->ent[i - 1].file, f2 = st->ent[i].file; /* in file order: a stable text */
            return tensor_err(err, st->label, st->ent[i].name, "is in both '%.900s' and '%.900s'",
                              st->files[f1 < f2 ? f1 : f2].label,
                              st->files[f1 < f2 ? f2 : f1].label);
        }
    }
    st->tensors = calloc((size_t)(st->count ? st->count : 1), sizeof(*st->tensors));
    if (st->tensors == NULL)
        return errprintf(err, "%.900s: out of memory", st->label);
    for (int i = 0; i < st->count; i++) {
        const entry_t *e = &st->ent[i];
        const st_file_t *f = &st->files[e->file];
        bmt_st_tensor_t *t = &st->tensors[i];
        t->name = e->name;
        t->dtype = e->dtype;
        t->ndim = e->ndim;
        memcpy(t->shape, e->shape, sizeof(t->shape));
        t->numel = e->numel;
        t->file = f->path;
        t->offset = (int64_t)(f->data_start + e->begin);
        t->nbytes = (int64_t)(e->end - e->begin);
    }
    return 0;
}

bmt_st_t *bmt_st_parse(const char *header, size_t len, uint64_t data_len, const char *file,
                       bmt_error_t *err)
{
    if (header == NULL && len > 0) {
        errprintf(err, "bmt_st_parse: header is NULL");
        return NULL;
    }
    if (file == NULL)
        file = "(header)";
    bmt_st_t *st = st_new(file, 1, err);
    if (st == NULL)
        return NULL;
    st_file_t *f = &st->files[0];
    if ((f->path = strdup(file)) == NULL) {
        bmt_st_close(st);
        errprintf(err, "%.900s: out of memory", file);
        return NULL;
    }
    f->label = base_name(f->path);
    f->data_start = 8 + (uint64_t)len;
    f->data_len = data_len;
    if (parse_header(st, header ? header : "", len, data_len, 0, err) < 0 || finish(st, err) < 0) {
        one_line(err);
        bmt_st_close(st);
        return NULL;
    }
    return st;
}

/* ------------------------------------------------------------ files */

/* pread until n bytes or end of file; returns the bytes read, -1 with errno. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

/* Open st->files[file] (path set) and parse its header into st. */
static int open_file(bmt_st_t *st, int file, bmt_error_t *err)
{
    st_file_t *f = &st->files[file];
    const char *label = f->label;
    f->fd = open(f->path,
                 O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused below, never waited on */
    if (f->fd < 0)
        return errprintf(err, "%.1200s: cannot open: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) < 0)
        return errprintf(err, "%.1200s: fstat: %s", f->path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return errprintf(err, "%.1200s: not a regular file", f->path);
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char n8[8];
    if (size < 8)
        return errprintf(err, "%.900s: file is %llu bytes, too short for the 8-byte header length",
                         label, (unsigned long long)size);
    if (pread_full(f->fd, n8, 8, 0) != 8)
        return errprintf(err, "%.900s: reading the header length: %s", label,
                         errno ? strerror(errno) : "short read");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | n8[i];
    if (n > BMT_ST_MAX_HEADER)
        return errprintf(err, "%.900s: header length %llu is over the limit of %llu bytes", label,
                         (unsigned long long)n, BMT_ST_MAX_HEADER);
    if (n > size - 8)
        return errprintf(err,
                         "%.900s: header length %llu runs past the end of the file (%llu bytes)",
                         label, (unsigned long long)n, (unsigned long long)size);
    char *hdr = malloc(n ? n : 1); /* n bytes of JSON, freed once parsed */
    if (hdr == NULL)
        return errprintf(err, "%.900s: out of memory for a %llu-byte header", label,
                         (unsigned long long)n);
    ssize_t got = pread_full(f->fd, hdr, n, 8);
    int rc;
    if (got != (ssize_t)n) {
        rc = errprintf(err, "%.900s: reading the header: %s", label,
                       got < 0 ? strerror(errno) : "short read");
    } else {
        ck_stream_t *h = ck_begin(); /* for bmt_st_set_checksums: the header as read */
        if (h == NULL) {
            free(hdr);
            return errprintf(err, "%.900s: out of memory", label);
        }
        ck_update(h, n8, 8);
        ck_update(h, hdr, n);
        f->header_hash = ck_end(h);
        rc = parse_header(st, hdr, n, size - 8 - n, file, err);
    }
    free(hdr);
    f->data_start = 8 + n;
    f->data_len = size - 8 - n;
    return rc;
}

static bmt_st_t *open_single(const char *path, bmt_error_t *err)
{
    bmt_st_t *st = st_new(path, 1, err);
    if (st == NULL)
        return NULL;
    if ((st->files[0].path = strdup(path)) == NULL) {
        errprintf(err, "%.1200s: out of memory", path);
        bmt_st_close(st);
        return NULL;
    }
    st->files[0].label = base_name(st->files[0].path);
    if (open_file(st, 0, err) < 0 || finish(st, err) < 0) {
        bmt_st_close(st);
        return NULL;
    }
    return st;
}

/* A weight_map file name must stay inside the index's directory. */
static bool name_escapes(const char *name)
{
    if (name[0] == '/')
        return true;
    for (const char *c = name; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.')
            return true;
        c += len;
        if (*c == '/')
            c++;
    }
    return false;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* How an index gets the header of its file st->files[file] (path and label set)
 * parsed into st: from the file itself (bmt_st_open) or from memory
 * (bmt_st_parse_index). Returns 0 or -1 with err set. */
typedef int (*load_fn)(bmt_st_t *st, int file, const void *arg, bmt_error_t *err);

/* The files of an index, its metadata, then every weight_map entry against the
 * files' contents (both ways). root: the parsed index; load reads each file's
 * header. */
static int index_files(bmt_st_t *st, json_t *root, const char *path, load_fn load, const void *arg,
                       bmt_error_t *err)
{
    const char *label = st->label;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm))
        return errprintf(err, "%.900s: no \"weight_map\" object", label);
    size_t nmap = json_object_size(wm);
    if (nmap == 0)
        return errprintf(err, "%.900s: weight_map names no tensors", label);
    const char **names = malloc(nmap * sizeof(*names));
    if (names == NULL)
        return errprintf(err, "%.900s: out of memory", label);
    size_t k = 0;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(wm, key, v)
    {
        const char *fn = json_string_value(v);
        if (fn == NULL || *fn == '\0')
            rc = tensor_err(err, label, key, "weight_map gives no file name");
        else if (name_escapes(fn))
            rc = tensor_err(err, label, key, "file '%.900s' is outside the index's directory", fn);
        if (rc < 0)
            break;
        names[k++] = fn;
    }
    int nfiles = 0;
    if (rc == 0) {
        qsort(names, k, sizeof(*names), by_str);
        for (size_t i = 0; i < k; i++)
            if (nfiles == 0 || strcmp(names[nfiles - 1], names[i]) != 0)
                names[nfiles++] = names[i];
        st_file_t *files = calloc((size_t)nfiles, sizeof(*files));
        if (files == NULL)
            rc = errprintf(err, "%.900s: out of memory", label);
        else {
            free(st->files);
            st->files = files;
            st->nfiles = nfiles;
            for (int f = 0; f < nfiles; f++)
                st->files[f].fd = -1;
        }
    }
    size_t dirlen = (size_t)(base_name(path) - path);
    for (int f = 0; f < nfiles && rc == 0; f++) {
        st_file_t *sf = &st->files[f];
        size_t flen = strlen(names[f]);
        if ((sf->path = malloc(dirlen + flen + 1)) == NULL) {
            rc = errprintf(err, "%.900s: out of memory", label);
            break;
        }
        memcpy(sf->path, path, dirlen);
        memcpy(sf->path + dirlen, names[f], flen + 1);
        sf->label = sf->path + dirlen;
        rc = load(st, f, arg, err);
    }
    free(names);
    if (rc < 0 || (rc = finish(st, err)) < 0)
        return rc;
    /* Both ways: every file's tensor is mapped to that file, and every mapped
     * tensor is in its file. */
    for (int i = 0; i < st->count; i++) {
        const char *fn = json_string_value(json_object_get(wm, st->ent[i].name));
        const char *in = st->files[st->ent[i].file].label;
        if (fn == NULL)
            return tensor_err(err, in, st->ent[i].name, "not in %.900s's weight_map", label);
        if (strcmp(fn, in) != 0)
            return tensor_err(err, label, st->ent[i].name,
                              "is in '%.900s', but weight_map says '%.900s'", in, fn);
    }
    json_object_foreach(wm, key, v)
    {
        if (bmt_st_find(st, key) < 0)
            return tensor_err(err, json_string_value(v), key,
                              "not in the file, but %.900s's weight_map puts it there", label);
    }
    return 0;
}

/* The whole index file (NUL-terminated; its size in *len), or NULL. */
static char *read_small_file(const char *path, size_t *len, bmt_error_t *err)
{
    const char *label = base_name(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused below */
    if (fd < 0) {
        errprintf(err, "%.1200s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    char *text = NULL;
    if (fstat(fd, &sb) < 0)
        errprintf(err, "%.1200s: fstat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        errprintf(err, "%.1200s: not a regular file", path);
    else if ((uint64_t)sb.st_size > BMT_ST_MAX_HEADER)
        errprintf(err, "%.900s: %llu bytes, over the limit of %llu for an index", label,
                  (unsigned long long)sb.st_size, BMT_ST_MAX_HEADER);
    else if ((text = malloc((size_t)sb.st_size + 1)) == NULL)
        errprintf(err, "%.900s: out of memory", label);
    else {
        ssize_t got = pread_full(fd, text, (size_t)sb.st_size, 0);
        if (got != (ssize_t)sb.st_size) {
            errprintf(err, "%.900s: cannot read: %s", label,
                      got < 0 ? strerror(errno) : "short read");
            free(text);
            text = NULL;
        } else {
            text[got] = '\0';
            *len = (size_t)got;
        }
    }
    close(fd);
    return text;
}

/* An index of len bytes at path (pure but for load, which reads each file's
 * header): bmt_st_open's index path and bmt_st_parse_index. */
static bmt_st_t *parse_index(const char *text, size_t len, const char *path, load_fn load,
                             const void *arg, bmt_error_t *err)
{
    const char *label = base_name(path);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        errprintf(err, "%.900s: not valid JSON: %.900s (at byte %d)", label, jerr.text,
                  jerr.position);
        return NULL;
    }
    bmt_st_t *st = NULL;
    if (!json_is_object(root)) {
        errprintf(err, "%.900s: not a JSON object", label);
    } else if ((st = st_new(path, 0, err)) != NULL) {
        int rc = 0;
        json_t *md = json_object_get(root, "metadata");
        if (md != NULL && !json_is_object(md) && !json_is_null(md))
            rc = errprintf(err, "%.900s: \"metadata\" is not an object", label);
        const char *mk;
        json_t *mv;
        json_object_foreach(md, mk, mv)
        {
            char num[32];
            if (rc < 0)
                break;
            if (json_is_string(mv))
                rc = meta_add(st, mk, json_string_value(mv), label, err);
            else if (json_is_integer(mv)) {
                snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(mv));
                rc = meta_add(st, mk, num, label, err);
            }
        }
        if (rc < 0 || index_files(st, root, path, load, arg, err) < 0) {
            bmt_st_close(st);
            st = NULL;
        }
    }
    json_decref(root);
    return st;
}

static int load_file(bmt_st_t *st, int file, const void *arg, bmt_error_t *err)
{
    (void)arg;
    return open_file(st, file, err);
}

static bmt_st_t *open_index(const char *path, bmt_error_t *err)
{
    size_t got = 0;
    char *text = read_small_file(path, &got, err);
    if (text == NULL)
        return NULL;
    bmt_st_t *st = parse_index(text, got, path, load_file, NULL, err);
    free(text);
    return st;
}

typedef struct shard_set {
    const bmt_st_shard_t *shards; /* (n) */
    int n;
} shard_set_t;

/* A file of the index from memory: the shard of that name, else the error a
 * missing file gives. */
static int load_memory(bmt_st_t *st, int file, const void *arg, bmt_error_t *err)
{
    const shard_set_t *set = arg;
    st_file_t *f = &st->files[file];
    for (int k = 0; k < set->n; k++) {
        const bmt_st_shard_t *s = &set->shards[k];
        if (s->file == NULL || strcmp(s->file, f->label) != 0)
            continue;
        if (s->header == NULL && s->len > 0)
            return errprintf(err, "%.900s: header is NULL", f->label);
        f->data_start = 8 + (uint64_t)s->len;
        f->data_len = s->data_len;
        return parse_header(st, s->header ? s->header : "", s->len, s->data_len, file, err);
    }
    return errprintf(err, "%.1200s: cannot open: %s", f->path, strerror(ENOENT));
}

bmt_st_t *bmt_st_parse_index(const char *json, size_t len, const char *path,
                             const bmt_st_shard_t *shards, int nshards, bmt_error_t *err)
{
    if (json == NULL && len > 0) {
        errprintf(err, "bmt_st_parse_index: the index is NULL");
        return NULL;
    }
    if (nshards < 0 || (shards == NULL && nshards > 0)) {
        errprintf(err, "bmt_st_parse_index: %d shards at %p", nshards, (const void *)shards);
        return NULL;
    }
    if (path == NULL || *path == '\0')
        path = BMT_ST_INDEX_NAME;
    shard_set_t set = { shards, nshards };
    bmt_st_t *st = parse_index(json ? json : "", len, path, load_memory, &set, err);
    if (st == NULL)
        one_line(err);
    return st;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static bmt_st_t *open_path(const char *path, bmt_error_t *err)
{
    if (path == NULL || *path == '\0') {
        errprintf(err, "bmt_st_open: no path");
        return NULL;
    }
    struct stat sb;
    if (stat(path, &sb) < 0) {
        errprintf(err, "%.1200s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(sb.st_mode))
        return ends_with(path, ".json") ? open_index(path, err) : open_single(path, err);
    size_t len = strlen(path);
    char *p = malloc(len + sizeof(BMT_ST_INDEX_NAME) + 1);
    if (p == NULL) {
        errprintf(err, "%.1200s: out of memory", path);
        return NULL;
    }
    /* model.safetensors first, the index only without it: what transformers'
     * from_pretrained reads (SAFE_WEIGHTS_NAME before SAFE_WEIGHTS_INDEX_NAME),
     * so that a directory holding both loads the same weights here and there.
     * A model.safetensors that is there but no regular file (a FIFO, a folder)
     * is refused by open_single, never passed over for the index; a dangling
     * link is no file (ENOENT), as for transformers' os.path.isfile. */
    bmt_st_t *st = NULL;
    sprintf(p, "%s%s%s", path, path[len - 1] == '/' ? "" : "/", BMT_ST_FILE_NAME);
    if (stat(p, &sb) == 0) {
        st = open_single(p, err);
    } else if (errno != ENOENT) { /* there, but unreadable: not the index's turn */
        errprintf(err, "%.1200s: cannot open: %s", p, strerror(errno));
    } else {
        sprintf(p, "%s%s%s", path, path[len - 1] == '/' ? "" : "/", BMT_ST_INDEX_NAME);
        if (stat(p, &sb) == 0)
            st = open_index(p, err);
        else
            errprintf(err, "%.1200s: holds neither " BMT_ST_INDEX_NAME " nor " BMT_ST_FILE_NAME,
                      path);
    }
    free(p);
    return st;
}

bmt_st_t *bmt_st_open(const char *path, bmt_error_t *err)
{
    bmt_st_t *st = open_path(path, err);
    if (st == NULL)
        one_line(err);
    return st;
}

/* ------------------------------------------------------------ listing */

int bmt_st_count(const bmt_st_t *st) { return st ? st->count : 0; }

int bmt_st_find(const bmt_st_t *st, const char *name)
{
    if (st == NULL || name == NULL)
        return -1;
    int lo = 0, hi = st->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->ent[mid].name, name);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

const bmt_st_tensor_t *bmt_st_tensor(const bmt_st_t *st, int i)
{
    return st && i >= 0 && i < st->count ? &st->tensors[i] : NULL;
}

const char *bmt_st_metadata(const bmt_st_t *st, const char *key)
{
    return st && key ? meta_get(st, key) : NULL;
}

/* ------------------------------------------------------------ reading */

/* The first unit of f whose bytes reach past off (units tile the data section). */
static size_t unit_at(const st_file_t *f, uint64_t off)
{
    size_t lo = 0, hi = f->nsums;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->sums[mid].offset + f->sums[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Unit u of f, already read into bytes: its hash must be the recorded one. */
static int check_unit(const st_file_t *f, size_t u, const unsigned char *bytes, const char *tensor,
                      bmt_error_t *err)
{
    const bmt_st_sum_t *s = &f->sums[u];
    uint64_t h = ck_hash(bytes, (size_t)s->len);
    if (h == s->xxh3)
        return 0;
    char want[17], have[17];
    ck_hex(s->xxh3, want);
    ck_hex(h, have);
    return tensor_err(err, f->label, tensor,
                      "checksum mismatch in bytes [%llu, %llu) of the file (recorded %s, read %s): "
                      "the file is damaged",
                      (unsigned long long)s->offset, (unsigned long long)(s->offset + s->len), want,
                      have);
}

/* Read bytes [off, off + n) of f into buf: all of them, or an error naming
 * the tensor. */
static int read_exact(const st_file_t *f, unsigned char *buf, uint64_t off, uint64_t n,
                      const char *tensor, bmt_error_t *err)
{
    ssize_t got = pread_full(f->fd, buf, (size_t)n, off);
    if (got < 0)
        return tensor_err(err, f->label, tensor, "pread of bytes [%llu, %llu): %s",
                          (unsigned long long)off, (unsigned long long)(off + n), strerror(errno));
    if ((uint64_t)got < n)
        return tensor_err(err, f->label, tensor,
                          "file ends at byte %llu, inside bytes [%llu, %llu) (truncated?)",
                          (unsigned long long)(off + (uint64_t)got), (unsigned long long)off,
                          (unsigned long long)(off + n));
    return 0;
}

/* Read unit u of f whole into buf and check its hash. */
static int read_unit(const st_file_t *f, size_t u, unsigned char *buf, const char *tensor,
                     bmt_error_t *err)
{
    const bmt_st_sum_t *s = &f->sums[u];
    if (read_exact(f, buf, s->offset, s->len, tensor, err) < 0)
        return -1;
    return check_unit(f, u, buf, tensor, err);
}

/* bmt_st_read of a file with checksums: the units that cover bytes [off, off +
 * nbytes) are read whole (at most one unit more than asked on each side) and
 * checked, and the part asked for is copied or converted from them. The
 * source bytes go through `src` as one stream, so an element that a unit
 * boundary cuts converts whole. */
static int read_checked(const st_file_t *f, const entry_t *e, uint64_t off, uint64_t nbytes,
                        unsigned char *dst, bmt_dtype_t dst_dtype, bool same, bmt_error_t *err)
{
    const size_t isz = dtypes[e->dtype].size, osz = bmt_dtype_size(dst_dtype);
    size_t maxlen = 0; /* the buffer serves the units not read into dst */
    for (size_t u = unit_at(f, off); u < f->nsums && f->sums[u].offset < off + nbytes; u++)
        if (f->sums[u].len > maxlen && !(same && f->sums[u].offset >= off &&
                                         f->sums[u].offset + f->sums[u].len <= off + nbytes))
            maxlen = (size_t)f->sums[u].len;
    unsigned char *buf = malloc(maxlen + 1);
    unsigned char *src = same ? NULL : malloc(maxlen + isz); /* pending source bytes */
    if (buf == NULL || (!same && src == NULL)) {
        free(buf);
        free(src);
        return tensor_err(err, f->label, e->name, "out of memory for a %zu-byte read buffer",
                          maxlen);
    }
    int rc = 0;
    size_t pending = 0;     /* bytes in src not yet converted (< isz between units) */
    uint64_t converted = 0; /* elements written to dst */
    uint64_t end = off + nbytes, at = off;
    for (size_t u = unit_at(f, off); rc == 0 && at < end; u++) {
        if (u >= f->nsums || f->sums[u].offset > at) {
            rc = tensor_err(err, f->label, e->name, "no checksum covers byte %llu",
                            (unsigned long long)at);
            break;
        }
        if (same && f->sums[u].offset == at && f->sums[u].offset + f->sums[u].len <= end) {
            /* Units wholly inside what is asked, no conversion: read a run of
             * them (up to 64 MiB) straight into dst with one pread and check
             * each there; no copy. */
            size_t v = u;
            while (v + 1 < f->nsums && f->sums[v + 1].offset + f->sums[v + 1].len <= end &&
                   f->sums[v + 1].offset + f->sums[v + 1].len - at <= ((uint64_t)64 << 20))
                v++;
            const uint64_t hi = f->sums[v].offset + f->sums[v].len;
            rc = read_exact(f, dst + (at - off), at, hi - at, e->name, err);
            for (size_t k = u; k <= v && rc == 0; k++)
                rc = check_unit(f, k, dst + (f->sums[k].offset - off), e->name, err);
            at = hi;
            u = v;
            continue;
        }
        if ((rc = read_unit(f, u, buf, e->name, err)) < 0)
            break;
        const bmt_st_sum_t *s = &f->sums[u];
        uint64_t hi = s->offset + s->len < end ? s->offset + s->len : end;
        const unsigned char *part = buf + (at - s->offset);
        size_t n = (size_t)(hi - at);
        if (same) {
            memcpy(dst + (at - off), part, n);
        } else {
            memcpy(src + pending, part, n);
            pending += n;
            size_t whole = pending / isz;
            bmt_st_convert(src, e->dtype, dst + converted * osz, dst_dtype, whole);
            converted += whole;
            memmove(src, src + whole * isz, pending - whole * isz);
            pending -= whole * isz;
        }
        at = hi;
    }
    free(buf);
    free(src);
    return rc;
}

static int read_range(bmt_st_t *st, int i, int64_t first, int64_t count, void *dst,
                      bmt_dtype_t dst_dtype, bmt_error_t *err)
{
    if (st == NULL)
        return errprintf(err, "bmt_st_read: the handle is NULL");
    if (i < 0 || i >= st->count)
        return errprintf(err, "%.900s: bmt_st_read: no tensor %d (the checkpoint has %d)",
                         st->label, i, st->count);
    const entry_t *e = &st->ent[i];
    const st_file_t *f = &st->files[e->file];
    size_t isz = dtypes[e->dtype].size, osz = bmt_dtype_size(dst_dtype);
    if (osz == 0)
        return tensor_err(err, f->label, e->name, "destination dtype %d is not f32, bf16 or f64",
                          (int)dst_dtype);
    if (!convertible(e->dtype))
        return tensor_err(err, f->label, e->name,
                          "is %s; only F64, F32, F16 and BF16 convert to %s", dtypes[e->dtype].name,
                          bmt_dtype_name(dst_dtype));
    if (first < 0 || count < 0 || first > e->numel || count > e->numel - first)
        return tensor_err(err, f->label, e->name,
                          "%lld elements from element %lld are out of range (it has %lld)",
                          (long long)count, (long long)first, (long long)e->numel);
    if (count == 0)
        return 0;
    if (dst == NULL)
        return tensor_err(err, f->label, e->name, "destination is NULL");
    if (f->fd < 0)
        return tensor_err(err, f->label, e->name, "no file behind this header (bmt_st_parse)");
    uint64_t off = f->data_start + e->begin + (uint64_t)first * isz;
    uint64_t nbytes = (uint64_t)count * isz;
    bool same = (e->dtype == BMT_ST_F32 && dst_dtype == BMT_F32) ||
                (e->dtype == BMT_ST_BF16 && dst_dtype == BMT_BF16) ||
                (e->dtype == BMT_ST_F64 && dst_dtype == BMT_F64);
    if (f->sums)
        return read_checked(f, e, off, nbytes, dst, dst_dtype, same, err);
    size_t chunk = same ? (size_t)nbytes : BMT_ST_CHUNK_BYTES / isz * isz;
    if (chunk > nbytes)
        chunk = (size_t)nbytes;
    unsigned char *buf = same ? dst : malloc(chunk); /* (chunk) source bytes */
    if (buf == NULL)
        return tensor_err(err, f->label, e->name, "out of memory for a %zu-byte read buffer",
                          chunk);
    int rc = 0;
    for (uint64_t done = 0; done < nbytes && rc == 0; done += chunk) {
        size_t n = nbytes - done < chunk ? (size_t)(nbytes - done) : chunk;
        ssize_t got = pread_full(f->fd, buf, n, off + done);
        if (got < 0)
            rc = tensor_err(err, f->label, e->name, "pread of bytes [%llu, %llu): %s",
                            (unsigned long long)(off + done), (unsigned long long)(off + done + n),
                            strerror(errno));
        else if ((size_t)got < n)
            rc = tensor_err(err, f->label, e->name,
                            "file ends at byte %llu, inside bytes [%llu, %llu) (truncated after "
                            "open?)",
                            (unsigned long long)(off + done + (uint64_t)got),
                            (unsigned long long)off, (unsigned long long)(off + nbytes));
        else if (!same)
            bmt_st_convert(buf, e->dtype, (unsigned char *)dst + done / isz * osz, dst_dtype,
                           n / isz);
    }
    if (!same)
        free(buf);
    return rc;
}

/* ------------------------------------------------------------ checksums */

static int by_sum_offset(const void *a, const void *b)
{
    const bmt_st_sum_t *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

uint64_t bmt_st_checksum(const void *p, size_t n) { return ck_hash(p, n); }

static int set_checksums(bmt_st_t *st, const char *file, uint64_t header_xxh3,
                         const bmt_st_sum_t *sums, size_t n, bmt_error_t *err)
{
    if (st == NULL || file == NULL || (n > 0 && sums == NULL))
        return errprintf(err, "bmt_st_set_checksums: NULL argument");
    int fi = -1;
    for (int k = 0; k < st->nfiles && fi < 0; k++)
        if (strcmp(st->files[k].path, file) == 0 || strcmp(st->files[k].label, file) == 0)
            fi = k;
    if (fi < 0)
        return errprintf(err, "%.900s: bmt_st_set_checksums: no file '%.900s' in it", st->label,
                         file);
    st_file_t *f = &st->files[fi];
    if (f->fd < 0)
        return errprintf(err, "%.900s: no file behind this header (bmt_st_parse)", f->label);
    if (header_xxh3 != f->header_hash) {
        char want[17], have[17];
        ck_hex(header_xxh3, want);
        ck_hex(f->header_hash, have);
        return errprintf(err,
                         "%.900s: checksum mismatch in its header, bytes [0, %llu) (recorded %s, "
                         "read %s): the file is damaged",
                         f->label, (unsigned long long)f->data_start, want, have);
    }
    bmt_st_sum_t *v = malloc(sizeof(*v) * (n ? n : 1));
    if (v == NULL)
        return errprintf(err, "%.900s: out of memory", f->label);
    if (n)
        memcpy(v, sums, sizeof(*v) * n);
    qsort(v, n, sizeof(*v), by_sum_offset);
    /* The units must cover the data section exactly: every byte read is checked. */
    uint64_t at = f->data_start, end = f->data_start + f->data_len;
    for (size_t k = 0; k < n; k++) {
        if (v[k].offset != at || v[k].len == 0 || v[k].len > BMT_ST_SUM_MAX_UNIT ||
            v[k].offset + v[k].len > end) {
            errprintf(err,
                      "%.900s: the checksums do not tile its data section [%llu, %llu): a unit "
                      "[%llu, +%llu) where byte %llu should start one (units are 1 to %llu bytes)",
                      f->label, (unsigned long long)f->data_start, (unsigned long long)end,
                      (unsigned long long)v[k].offset, (unsigned long long)v[k].len,
                      (unsigned long long)at, (unsigned long long)BMT_ST_SUM_MAX_UNIT);
            free(v);
            return -1;
        }
        at += v[k].len;
    }
    if (at != end) {
        free(v);
        return errprintf(err,
                         "%.900s: the checksums end at byte %llu; its data section ends at %llu "
                         "(the file is %s)",
                         f->label, (unsigned long long)at, (unsigned long long)end,
                         at < end ? "longer than when it was written" : "truncated");
    }
    free(f->sums);
    f->sums = v;
    f->nsums = n;
    return 0;
}

int bmt_st_set_checksums(bmt_st_t *st, const char *file, uint64_t header_xxh3,
                         const bmt_st_sum_t *sums, size_t n, bmt_error_t *err)
{
    return set_checksums(st, file, header_xxh3, sums, n, err) < 0 ? one_line(err) : 0;
}

int bmt_st_verify(bmt_st_t *st, uint64_t *bytes, bmt_error_t *err)
{
    if (bytes)
        *bytes = 0;
    if (st == NULL)
        return errprintf(err, "bmt_st_verify: the handle is NULL");
    int rc = 0;
    for (int k = 0; k < st->nfiles && rc == 0; k++) {
        const st_file_t *f = &st->files[k];
        if (f->sums == NULL) {
            rc = errprintf(err, "%.900s: no checksums recorded for it", f->label);
            break;
        }
        size_t maxlen = 0;
        for (size_t u = 0; u < f->nsums; u++)
            maxlen = f->sums[u].len > maxlen ? (size_t)f->sums[u].len : maxlen;
        unsigned char *buf = malloc(maxlen + 1);
        if (buf == NULL) {
            rc = errprintf(err, "%.900s: out of memory", f->label);
            break;
        }
        for (size_t u = 0; u < f->nsums && rc == 0; u++) {
            /* name the tensor that holds the unit's first byte */
            const char *tensor = "?";
            for (int t = 0; t < st->count; t++)
                if (st->ent[t].file == k && f->data_start + st->ent[t].begin <= f->sums[u].offset &&
                    f->sums[u].offset < f->data_start + st->ent[t].end)
                    tensor = st->ent[t].name;
            rc = read_unit(f, u, buf, tensor, err);
            if (rc == 0 && bytes)
                *bytes += f->sums[u].len;
        }
        free(buf);
    }
    return rc < 0 ? one_line(err) : 0;
}

int bmt_st_read(bmt_st_t *st, int i, int64_t first, int64_t count, void *dst, bmt_dtype_t dst_dtype,
                bmt_error_t *err)
{
    return read_range(st, i, first, count, dst, dst_dtype, err) < 0 ? one_line(err) : 0;
}

/* ------------------------------------------------------------ discovery */

typedef struct layer_match {
    int layer;         /* N, or -1: not a layer tensor */
    size_t stack_len;  /* bytes of "transformer.h." */
    size_t prefix_len; /* bytes of "transformer.h.3." */
} layer_match_t;

/* Is name "<...><stack>.<N>.<rest>" with stack one of the layer words? 1 yes,
 * 0 no, -1 a malformed layer number. */
static int match_layer(const char *name, layer_match_t *m, const char *label, bmt_error_t *err)
{
    static const char *const words[] = { "h", "layers", "layer", "blocks", "block" };
    for (const char *c = name;;) {
        const char *dot = strchr(c, '.');
        if (dot == NULL)
            return 0;
        bool word = false;
        for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++)
            word |= strlen(words[w]) == (size_t)(dot - c) &&
                    memcmp(words[w], c, (size_t)(dot - c)) == 0;
        const char *d = dot + 1;
        size_t nd = strspn(d, "0123456789");
        if (word && nd > 0 && d[nd] == '.' && d[nd + 1] != '\0') {
            if (nd > 1 && d[0] == '0')
                return tensor_err(err, label, name, "layer number '%.*s' has a leading zero",
                                  (int)nd, d);
            long v = nd > 6 ? BMT_ST_MAX_LAYERS : strtol(d, NULL, 10);
            if (v >= BMT_ST_MAX_LAYERS)
                return tensor_err(err, label, name, "layer number %.*s is too large (at most %d)",
                                  (int)(nd > 20 ? 20 : nd), d, BMT_ST_MAX_LAYERS - 1);
            m->layer = (int)v;
            m->stack_len = (size_t)(d - name);
            m->prefix_len = (size_t)(d + nd + 1 - name);
            return 1;
        }
        c = dot + 1;
    }
}

static bool is_head(const char *name)
{
    static const char *const words[] = { "wte", "wpe", "embed", "tok_emb", "pos_emb" };
    for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++)
        if (strstr(name, words[w]))
            return true;
    return false;
}

void bmt_st_plan_free(bmt_st_plan_t *plan)
{
    if (plan == NULL)
        return;
    if (plan->blocks) {
        free((void *)plan->blocks[0].tensors);
        free((void *)plan->blocks[0].names);
        if (plan->nlayers > 0)
            free((void *)plan->blocks[1].name);
    }
    free(plan->blocks);
    free((void *)plan->layer_prefix);
    free(plan);
}

/* Layer l against layer 0: same relative names (both sorted) and shapes. */
static int compare_layers(const bmt_st_t *st, const bmt_st_block_t *a, const bmt_st_block_t *b,
                          bmt_error_t *err)
{
    int i = 0, j = 0;
    char s1[64], s2[64];
    while (i < a->count || j < b->count) {
        int c = i == a->count ? 1 : j == b->count ? -1 : strcmp(a->names[i], b->names[j]);
        if (c < 0)
            return errprintf(err,
                             "%.900s: layer '%.900s' has no tensor '%.900s' (layer '%.900s' has)",
                             st->label, b->name, a->names[i], a->name);
        if (c > 0)
            return errprintf(
                err, "%.900s: layer '%.900s' has tensor '%.900s', which layer '%.900s' lacks",
                st->label, b->name, b->names[j], a->name);
        const bmt_st_tensor_t *x = &st->tensors[a->tensors[i]], *y = &st->tensors[b->tensors[j]];
        if (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(x->shape)) != 0)
            return tensor_err(err, st->label, y->name, "shape %s differs from %s in layer '%.900s'",
                              shape_str(s1, sizeof(s1), y->ndim, y->shape),
                              shape_str(s2, sizeof(s2), x->ndim, x->shape), a->name);
        i++;
        j++;
    }
    return 0;
}

static int discover(const bmt_st_t *st, bmt_st_plan_t **out, bmt_error_t *err)
{
    if (st == NULL || out == NULL)
        return errprintf(err, "bmt_st_discover: a handle and a place for the plan are required");
    int n = st->count;
    layer_match_t *m = calloc((size_t)(n ? n : 1), sizeof(*m));
    if (m == NULL)
        return errprintf(err, "%.900s: out of memory", st->label);
    int nlayers = 0, ref = -1; /* ref: the first layer tensor, whose stack all must share */
    for (int i = 0; i < n; i++) {
        const char *name = st->ent[i].name;
        int r = match_layer(name, &m[i], st->label, err);
        if (r < 0) {
            free(m);
            return -1;
        }
        if (r == 0) {
            m[i].layer = -1;
            continue;
        }
        if (ref < 0) {
            ref = i;
        } else if (m[i].stack_len != m[ref].stack_len ||
                   memcmp(name, st->ent[ref].name, m[i].stack_len) != 0) {
            int rc = errprintf(err,
                               "%.900s: tensors '%.900s' and '%.900s' are in two layer stacks "
                               "('%.*s' and '%.*s'); bmt discovers one",
                               st->label, st->ent[ref].name, name, (int)m[ref].stack_len - 1,
                               st->ent[ref].name, (int)m[i].stack_len - 1, name);
            free(m);
            return rc;
        }
        if (m[i].layer + 1 > nlayers)
            nlayers = m[i].layer + 1;
    }
    /* per[l]: tensors of layer l. Every layer 0..L-1 must have one, so a gap is
     * refused before anything is allocated per layer: else one tensor named
     * "<4000 bytes>.h.99999.x" (a 4 KB header) cost 100000 block names of 4 KB,
     * 400 MB (tests/fuzz/st_header.c reports it under -malloc_limit_mb:
     * tests/fuzz/regressions/st_header/layer-99999-long-prefix). Past this
     * check L <= the number of layer tensors, and memory is O(header). */
    size_t stack_len = ref >= 0 ? m[ref].stack_len : 0;
    int *per = calloc((size_t)nlayers + 1, sizeof(*per)); /* at most BMT_ST_MAX_LAYERS */
    if (per == NULL) {
        free(m);
        return errprintf(err, "%.900s: out of memory", st->label);
    }
    for (int i = 0; i < n; i++)
        if (m[i].layer >= 0)
            per[m[i].layer]++;
    for (int l = 0; l < nlayers; l++) {
        if (per[l] == 0) {
            char a[601], b[601]; /* the names of blocks l and L-1, as the plan calls them
                                  * (two of 600 bytes leave room for the message) */
            snprintf(a, sizeof(a), "%.*s%d", (int)stack_len, st->ent[ref].name, l);
            snprintf(b, sizeof(b), "%.*s%d", (int)stack_len, st->ent[ref].name, nlayers - 1);
            free(per);
            free(m);
            return errprintf(err,
                             "%.900s: layer '%.900s' is missing: the stack goes up to '%.900s' "
                             "but has no tensor of layer %d",
                             st->label, a, b, l);
        }
    }
    bmt_st_plan_t *plan = calloc(1, sizeof(*plan));
    bmt_st_block_t *blocks = calloc((size_t)nlayers + 2, sizeof(*blocks));
    int *idx = malloc((size_t)(n ? n : 1) * sizeof(*idx));
    const char **names = malloc((size_t)(n ? n : 1) * sizeof(*names));
    char *bnames = malloc((size_t)nlayers * (stack_len + 8) + 1); /* "transformer.h.3\0"... */
    char *prefix = malloc(stack_len + 1);
    if (!per || !plan || !blocks || !idx || !names || !bnames || !prefix) {
        free(per);
        free(plan);
        free(blocks);
        free(idx);
        free(names);
        free(bnames);
        free(prefix);
        free(m);
        return errprintf(err, "%.900s: out of memory", st->label);
    }
    plan->nlayers = nlayers;
    plan->nblocks = nlayers + 2;
    plan->blocks = blocks;
    if (ref >= 0)
        memcpy(prefix, st->ent[ref].name, stack_len);
    prefix[stack_len] = '\0';
    plan->layer_prefix = prefix;

    /* Blocks in model order: head, layers, tail; per holds the layers' sizes. */
    int nhead = 0;
    for (int i = 0; i < n; i++)
        if (m[i].layer < 0 && is_head(st->ent[i].name))
            nhead++;
    char *bn = bnames;
    int pos = 0;
    blocks[0] = (bmt_st_block_t){ BMT_ST_HEAD, "head", -1, 0, idx, names };
    pos += nhead;
    for (int l = 0; l < nlayers; l++) {
        int len = sprintf(bn, "%.*s%d", (int)stack_len, prefix, l);
        blocks[1 + l] = (bmt_st_block_t){ BMT_ST_LAYER, bn, l, 0, idx + pos, names + pos };
        bn += len + 1;
        pos += per[l];
    }
    blocks[nlayers + 1] = (bmt_st_block_t){ BMT_ST_TAIL, "tail", -1, 0, idx + pos, names + pos };
    if (nlayers == 0)
        free(bnames);
    for (int i = 0; i < n; i++) {
        bmt_st_block_t *b = m[i].layer >= 0            ? &blocks[1 + m[i].layer]
                            : is_head(st->ent[i].name) ? &blocks[0]
                                                       : &blocks[nlayers + 1];
        ((int *)b->tensors)[b->count] = i;
        ((const char **)b->names)[b->count] =
            st->ent[i].name + (m[i].layer >= 0 ? m[i].prefix_len : 0);
        b->count++;
    }
    free(m);
    int rc = 0;
    for (int l = 1; l < nlayers && rc == 0; l++)
        rc = compare_layers(st, &blocks[1], &blocks[1 + l], err);
    free(per);
    if (rc < 0) {
        bmt_st_plan_free(plan);
        return -1;
    }
    *out = plan;
    return 0;
}

int bmt_st_discover(const bmt_st_t *st, bmt_st_plan_t **plan, bmt_error_t *err)
{
    return discover(st, plan, err) < 0 ? one_line(err) : 0;
}
