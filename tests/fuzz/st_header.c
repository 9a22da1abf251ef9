/* tests/fuzz/st_header.c — libFuzzer target: bmt_st_parse on any header.
 *
 * Input: an optional first line with the data section's length in decimal,
 * then the header's JSON bytes (without the first line, the whole input is the
 * header and the data section is empty). The seeds in
 * tests/fuzz/seeds/st_header/ read as plain text.
 *
 * A refused header must come back as one line naming the file. An accepted
 * one must satisfy st_check.h (sorted, found, tiled, a consistent plan), refuse
 * reads (no file behind it), and survive a round trip: the header rebuilt from
 * its own listing with Jansson parses again into the same listing.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "st_check.h"

#define FILE_PATH "ckpt/x.safetensors"
#define PREFIX "x.safetensors: "

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The data section's length from "<digits>\n" at the start (saturating), and
 * where the header starts; 0 and the whole input without such a line. */
static uint64_t split(const uint8_t *data, size_t size, size_t *hdr)
{
    uint64_t v = 0;
    size_t i = 0;
    while (i < size && i < 24 && data[i] >= '0' && data[i] <= '9') {
        uint64_t d = (uint64_t)(data[i] - '0');
        v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
        i++;
    }
    if (i > 0 && i < size && data[i] == '\n') {
        *hdr = i + 1;
        return v;
    }
    *hdr = 0;
    return 0;
}

/* The header that lists exactly st's tensors, data_offsets relative to data_start. */
static char *rebuild(const bmt_st_t *st, uint64_t data_start, size_t *len)
{
    json_t *root = json_object();
    CHECK(root != NULL);
    for (int i = 0; i < bmt_st_count(st); i++) {
        const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_int_t begin = (json_int_t)((uint64_t)t->offset - data_start);
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", bmt_st_dtype_name(t->dtype), "shape",
                              shape, "data_offsets", begin, begin + (json_int_t)t->nbytes);
        CHECK(e != NULL && json_object_set_new(root, t->name, e) == 0);
    }
    char *text = json_dumps(root, JSON_COMPACT);
    CHECK(text != NULL);
    json_decref(root);
    *len = strlen(text);
    return text;
}

static void check_same(const bmt_st_t *a, const bmt_st_t *b, uint64_t start_a, uint64_t start_b)
{
    CHECK(bmt_st_count(a) == bmt_st_count(b));
    for (int i = 0; i < bmt_st_count(a); i++) {
        const bmt_st_tensor_t *x = bmt_st_tensor(a, i), *y = bmt_st_tensor(b, i);
        CHECK(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim);
        CHECK(memcmp(x->shape, y->shape, sizeof(x->shape)) == 0 && x->nbytes == y->nbytes);
        CHECK((uint64_t)x->offset - start_a == (uint64_t)y->offset - start_b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t at;
    uint64_t data_len = split(data, size, &at);
    const char *hdr = (const char *)data + at; /* (len) bytes, not NUL-terminated */
    size_t len = size - at;
    bmt_error_t err = { { 0 } };
    bmt_st_t *st = bmt_st_parse(hdr, len, data_len, FILE_PATH, &err);
    if (st == NULL) {
        check_error(&err, PREFIX);
        return 0;
    }
    check_listing(st);
    for (int i = 0; i < bmt_st_count(st); i++)
        CHECK(strcmp(bmt_st_tensor(st, i)->file, FILE_PATH) == 0);
    CHECK(check_tiling(st, FILE_PATH, 8 + (uint64_t)len, data_len) == bmt_st_count(st));
    check_no_read(st, PREFIX);
    check_plan(st, PREFIX);

    size_t len2;
    char *text = rebuild(st, 8 + (uint64_t)len, &len2);
    bmt_st_t *st2 = bmt_st_parse(text, len2, data_len, FILE_PATH, &err);
    if (st2 == NULL)
        fprintf(stderr, "the rebuilt header %s is refused: %s\n", text, err.text);
    CHECK(st2 != NULL);
    check_same(st, st2, 8 + (uint64_t)len, 8 + (uint64_t)len2);
    bmt_st_close(st2);
    free(text);
    bmt_st_close(st);
    return 0;
}
