/* tests/fuzz/st_index.c — libFuzzer target: bmt_st_parse_index, an HF index
 * with the headers of its shards in memory (the code bmt_st_open runs on
 * model.safetensors.index.json, without the files).
 *
 * Input: the index's JSON, then for each shard a line "@<name> <data_len>"
 * followed by that shard's header (up to the next line starting with '@'):
 *
 *   {"weight_map": {"a": "s1.safetensors"}}
 *   @s1.safetensors 4
 *   {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
 *
 * The index sits at ckpt/model.safetensors.index.json. Every piece is copied
 * into a buffer of its own size, so AddressSanitizer sees a read past any one.
 * A refused index must come back as one line naming the index, a shard or a
 * file of the weight_map. An accepted one must satisfy st_check.h, agree with
 * the weight_map both ways (checked here with Jansson), tile every shard it
 * names, and carry the index's metadata.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "st_check.h"

#define INDEX_PATH "ckpt/model.safetensors.index.json"
#define INDEX_LABEL "model.safetensors.index.json"
#define MAX_SHARDS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *copy(const uint8_t *p, size_t n) /* (n) bytes, not NUL-terminated */
{
    char *s = malloc(n ? n : 1);
    CHECK(s != NULL);
    memcpy(s, p, n);
    return s;
}

static const uint8_t *next_section(const uint8_t *p, const uint8_t *end)
{
    for (; p + 1 < end; p++)
        if (p[0] == '\n' && p[1] == '@')
            return p;
    return end;
}

/* Does the error start with what the weight_map calls a file (labels are cut
 * at 48 bytes)? */
static bool names_a_mapped_file(const char *text, json_t *wm)
{
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v)
    {
        const char *fn = json_string_value(v);
        size_t n = fn ? strlen(fn) : 0;
        if (n > 0 && strncmp(text, fn, n < 48 ? n : 48) == 0)
            return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *end = data + size, *p = next_section(data, end);
    char *index = copy(data, (size_t)(p - data));
    size_t index_len = (size_t)(p - data);
    bmt_st_shard_t shards[MAX_SHARDS];
    char *names[MAX_SHARDS];
    int n = 0;
    while (p < end && n < MAX_SHARDS) {
        p += 2; /* "\n@" */
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *line_end = nl ? nl : end;
        const uint8_t *sp = memchr(p, ' ', (size_t)(line_end - p));
        const uint8_t *name_end = sp ? sp : line_end;
        uint64_t data_len = 0;
        for (const uint8_t *d = sp ? sp + 1 : line_end; d < line_end && *d >= '0' && *d <= '9'; d++)
            data_len = data_len > (UINT64_MAX - 9) / 10 ? UINT64_MAX : data_len * 10 + (*d - '0');
        const uint8_t *hdr = nl ? nl + 1 : end, *next = next_section(hdr, end);
        names[n] = malloc((size_t)(name_end - p) + 1); /* the name may end the input */
        CHECK(names[n] != NULL);
        memcpy(names[n], p, (size_t)(name_end - p));
        names[n][name_end - p] = '\0';
        shards[n] = (bmt_st_shard_t){ names[n], copy(hdr, (size_t)(next - hdr)),
                                      (size_t)(next - hdr), data_len };
        n++;
        p = next;
    }

    bmt_error_t err = { { 0 } };
    bmt_st_t *st = bmt_st_parse_index(index, index_len, INDEX_PATH, shards, n, &err);
    json_t *root = json_loadb(index, index_len, JSON_REJECT_DUPLICATES, NULL);
    json_t *wm = json_object_get(root, "weight_map");
    if (st == NULL) {
        check_error(&err, NULL);
        bool named = strncmp(err.text, INDEX_LABEL ": ", strlen(INDEX_LABEL ": ")) == 0 ||
                     strncmp(err.text, "ckpt/", 5) == 0 || names_a_mapped_file(err.text, wm);
        if (!named)
            fprintf(stderr, "error \"%s\" names neither the index nor a file\n", err.text);
        CHECK(named);
    } else {
        /* Accepted: the index was a JSON object with a weight_map of file names. */
        CHECK(json_is_object(wm));
        check_listing(st);
        CHECK((size_t)bmt_st_count(st) == json_object_size(wm));
        const char *key;
        json_t *v;
        json_object_foreach(wm, key, v)
        {
            int i = bmt_st_find(st, key);
            CHECK(i >= 0 && json_is_string(v));
            const char *file = bmt_st_tensor(st, i)->file;
            CHECK(strncmp(file, "ckpt/", 5) == 0 && strcmp(file + 5, json_string_value(v)) == 0);
        }
        /* Each shard the map names (the first of that name) is tiled exactly. */
        int covered = 0;
        for (int k = 0; k < n; k++) {
            bool first = true, used = false;
            for (int j = 0; j < k; j++)
                first &= strcmp(names[j], names[k]) != 0;
            json_object_foreach(wm, key, v) used |= strcmp(json_string_value(v), names[k]) == 0;
            if (!first || !used)
                continue;
            char path[4096];
            snprintf(path, sizeof(path), "ckpt/%s", names[k]);
            covered += check_tiling(st, path, 8 + (uint64_t)shards[k].len, shards[k].data_len);
        }
        CHECK(covered == bmt_st_count(st));
        /* The index's metadata comes first: its strings, and integers in decimal. */
        json_object_foreach(json_object_get(root, "metadata"), key, v)
        {
            char num[32];
            const char *want = json_string_value(v);
            if (json_is_integer(v)) {
                snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
                want = num;
            }
            const char *got = bmt_st_metadata(st, key);
            CHECK(want == NULL || (got != NULL && strcmp(got, want) == 0));
        }
        check_no_read(st, NULL);
        check_plan(st, INDEX_LABEL ": ");
        bmt_st_close(st);
    }
    json_decref(root);
    for (int k = 0; k < n; k++) {
        free(names[k]);
        free((void *)shards[k].header);
    }
    free(index);
    return 0;
}
