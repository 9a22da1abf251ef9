/* tests/fuzz/st_check.h — what must hold of every handle bmt_st_parse or
 * bmt_st_parse_index accepts, and of every error they return; shared by the fuzz
 * targets. A broken invariant prints what broke and aborts, which libFuzzer
 * reports as a crash (and saves the input), like a sanitizer error.
 *
 * The checks use only the public API, so they restate docs/safetensors.md
 * rather than the parser's own code: tensors sorted and found by name, fields
 * consistent (numel = product of shape, nbytes = numel x item size), each
 * file's data section tiled exactly (no hole, no overlap, no tail), and a plan
 * whose blocks cover every tensor once, with the layers alike.
 */
#ifndef BMT_FUZZ_ST_CHECK_H
#define BMT_FUZZ_ST_CHECK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/safetensors.h"

static inline void check_failed(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
    abort();
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check_failed(__FILE__, __LINE__, #cond);                                               \
    } while (0)

/* An error: one non-empty, NUL-terminated, printable line that starts with
 * prefix. */
static inline void check_error(const bmt_error_t *err, const char *prefix)
{
    size_t n = strnlen(err->text, sizeof(err->text));
    CHECK(n > 0 && n < sizeof(err->text));
    for (size_t i = 0; i < n; i++)
        CHECK((unsigned char)err->text[i] >= 0x20 && err->text[i] != 0x7f);
    if (prefix != NULL && strncmp(err->text, prefix, strlen(prefix)) != 0) {
        fprintf(stderr, "error \"%s\" does not start with \"%s\"\n", err->text, prefix);
        CHECK(!"the error names the file");
    }
}

/* The listing: sorted, found, self-consistent. */
static inline void check_listing(const bmt_st_t *st)
{
    int n = bmt_st_count(st);
    CHECK(n >= 0);
    CHECK(bmt_st_tensor(st, -1) == NULL && bmt_st_tensor(st, n) == NULL);
    CHECK(bmt_st_find(st, NULL) == -1);
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
        CHECK(t != NULL && t->name != NULL && t->file != NULL);
        CHECK(prev == NULL || strcmp(prev, t->name) < 0);
        CHECK(bmt_st_find(st, t->name) == i);
        CHECK((unsigned)t->dtype < BMT_ST_DTYPE_COUNT);
        CHECK(t->ndim >= 0 && t->ndim <= BMT_ST_MAX_DIMS);
        int64_t numel = 1;
        for (int d = 0; d < BMT_ST_MAX_DIMS; d++) {
            CHECK(d < t->ndim ? t->shape[d] >= 0 : t->shape[d] == 0);
            if (d < t->ndim)
                CHECK(!__builtin_mul_overflow(numel, t->shape[d], &numel));
        }
        CHECK(t->numel == numel);
        int64_t nbytes;
        CHECK(!__builtin_mul_overflow(numel, (int64_t)bmt_st_dtype_size(t->dtype), &nbytes));
        CHECK(t->nbytes == nbytes);
        CHECK(t->offset >= 8);
        prev = t->name;
    }
    CHECK(bmt_st_metadata(st, NULL) == NULL);
    const char *fmt = bmt_st_metadata(st, "format");
    CHECK(fmt == NULL || strlen(fmt) < SIZE_MAX);
}

static int by_offset(const void *a, const void *b)
{
    const bmt_st_tensor_t *x = *(const bmt_st_tensor_t *const *)a;
    const bmt_st_tensor_t *y = *(const bmt_st_tensor_t *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The tensors of one file tile its data section [data_start, data_start +
 * data_len) exactly; returns how many tensors the file holds. */
static inline int check_tiling(const bmt_st_t *st, const char *file, uint64_t data_start,
                               uint64_t data_len)
{
    int n = bmt_st_count(st), k = 0;
    const bmt_st_tensor_t **v = malloc((size_t)(n ? n : 1) * sizeof(*v));
    CHECK(v != NULL);
    for (int i = 0; i < n; i++)
        if (strcmp(bmt_st_tensor(st, i)->file, file) == 0)
            v[k++] = bmt_st_tensor(st, i);
    qsort(v, (size_t)k, sizeof(*v), by_offset);
    uint64_t pos = data_start;
    for (int i = 0; i < k; i++) {
        CHECK((uint64_t)v[i]->offset == pos); /* no hole, no overlap */
        pos += (uint64_t)v[i]->nbytes;
        CHECK(pos <= data_start + data_len);
    }
    CHECK(pos == data_start + data_len); /* no tail */
    free(v);
    return k;
}

/* A handle without files reads nothing: bmt_st_read fails, dst untouched. */
static inline void check_no_read(bmt_st_t *st, const char *prefix)
{
    for (int i = 0; i < bmt_st_count(st); i++) {
        if (bmt_st_tensor(st, i)->numel == 0)
            continue;
        unsigned char buf[8];
        memset(buf, 0x5a, sizeof(buf));
        bmt_error_t err = { { 0 } };
        CHECK(bmt_st_read(st, i, 0, 1, buf, BMT_F64, &err) == -1);
        CHECK(buf[0] == 0x5a && buf[7] == 0x5a);
        check_error(&err, prefix);
        return;
    }
}

static inline bool is_head_name(const char *name)
{
    static const char *const words[] = { "wte", "wpe", "embed", "tok_emb", "pos_emb" };
    for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++)
        if (strstr(name, words[w]))
            return true;
    return false;
}

/* Discovery: an error that names what was opened, or a plan whose blocks cover
 * every tensor once, in model order, with every layer like layer 0. */
static inline void check_plan(const bmt_st_t *st, const char *prefix)
{
    bmt_st_plan_t *plan = NULL;
    bmt_error_t err = { { 0 } };
    if (bmt_st_discover(st, &plan, &err) < 0) {
        CHECK(plan == NULL);
        check_error(&err, prefix);
        return;
    }
    int n = bmt_st_count(st), L = plan->nlayers;
    CHECK(L >= 0 && L <= BMT_ST_MAX_LAYERS && plan->nblocks == L + 2 && plan->blocks != NULL);
    CHECK(plan->layer_prefix != NULL && (L > 0 || plan->layer_prefix[0] == '\0'));
    unsigned char *seen = calloc((size_t)(n ? n : 1), 1);
    CHECK(seen != NULL);
    int total = 0;
    for (int b = 0; b < plan->nblocks; b++) {
        const bmt_st_block_t *k = &plan->blocks[b];
        bool layer = b > 0 && b <= L;
        CHECK(k->kind == (b == 0 ? BMT_ST_HEAD : layer ? BMT_ST_LAYER : BMT_ST_TAIL));
        CHECK(k->layer == (layer ? b - 1 : -1) && k->name != NULL && k->count >= 0);
        CHECK(k->count == 0 || (k->tensors != NULL && k->names != NULL));
        if (layer) {
            char want[64];
            size_t plen = strlen(plan->layer_prefix);
            snprintf(want, sizeof(want), "%d", b - 1);
            CHECK(strncmp(k->name, plan->layer_prefix, plen) == 0 &&
                  strcmp(k->name + plen, want) == 0);
            CHECK(k->count > 0 && k->count == plan->blocks[1].count);
        } else {
            CHECK(strcmp(k->name, b == 0 ? "head" : "tail") == 0);
        }
        for (int j = 0; j < k->count; j++) {
            int i = k->tensors[j];
            CHECK(i >= 0 && i < n && seen[i] == 0);
            CHECK(j == 0 || k->tensors[j - 1] < i); /* sorted by name */
            seen[i] = 1;
            const char *full = bmt_st_tensor(st, i)->name, *rel = k->names[j];
            CHECK(rel != NULL);
            if (layer) {
                size_t bl = strlen(k->name);
                CHECK(strncmp(full, k->name, bl) == 0 && full[bl] == '.' &&
                      strcmp(full + bl + 1, rel) == 0 && rel[0] != '\0');
                const bmt_st_block_t *l0 = &plan->blocks[1];
                const bmt_st_tensor_t *x = bmt_st_tensor(st, l0->tensors[j]);
                const bmt_st_tensor_t *y = bmt_st_tensor(st, i);
                CHECK(strcmp(l0->names[j], rel) == 0);
                CHECK(x->ndim == y->ndim && memcmp(x->shape, y->shape, sizeof(x->shape)) == 0);
            } else {
                CHECK(strcmp(full, rel) == 0);
                CHECK(is_head_name(full) == (b == 0));
            }
        }
        total += k->count;
    }
    CHECK(total == n);
    free(seen);
    bmt_st_plan_free(plan);
}

#endif
