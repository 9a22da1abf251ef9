/* tests/progs/gpt2_data_check.c — drives examples/common/data.h from the shell,
 * for tests/integration/test_gpt2_data.sh (which compares it with numpy and a
 * transcription of llm.c's DataLoader).
 *
 *   gpt2_data_check write OUT.bin RAW      tokens from RAW (uint16 LE, no header)
 *   gpt2_data_check write32 OUT.bin RAW    a "llama-3" shard from RAW (uint32 LE)
 *   gpt2_data_check read PATTERN B T RANK WORLD STEPS
 *        one line per step: "SHARD POS | inputs... | targets..." where (SHARD,
 *        POS) is the position after the step
 *   gpt2_data_check tokenize TEXT PREFIX VAL_FRACTION
 *   gpt2_data_check decode SHARD.bin       its tokens as text on stdout
 *
 * Exit status 0, 1 with "gpt2_data_check: <error>" on stderr, 2 for bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/data.h"

static int fail(const bmt_error_t *err)
{
    fprintf(stderr, "gpt2_data_check: %s\n", err->text);
    return 1;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: gpt2_data_check write|write32 OUT RAW | read PATTERN B T RANK WORLD STEPS |"
            " tokenize TEXT PREFIX FRAC | decode SHARD\n");
    return 2;
}

/* The whole of a small file. */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (nb == NULL)
                free(buf);
            buf = nb;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

static int cmd_write(const char *out, const char *raw, int width)
{
    size_t len = 0;
    uint8_t *b = slurp(raw, &len);
    if (b == NULL || len % (size_t)width) {
        fprintf(stderr, "gpt2_data_check: %s: unreadable or not a whole number of tokens\n", raw);
        free(b);
        return 1;
    }
    size_t n = len / (size_t)width;
    uint16_t *t = malloc((n ? n : 1) * sizeof(*t));
    uint32_t *t32 = malloc((n ? n : 1) * sizeof(*t32));
    for (size_t i = 0; t && t32 && i < n; i++) {
        t32[i] = 0;
        for (int k = 0; k < width; k++)
            t32[i] |= (uint32_t)b[(size_t)width * i + (size_t)k] << (8 * k);
        t[i] = (uint16_t)t32[i];
    }
    bmt_error_t err;
    int rc = t == NULL || t32 == NULL ? -1
             : width == 4             ? data_write_shard_u32(out, t32, n, &err)
                                      : data_write_shard(out, t, n, &err);
    free(b);
    free(t);
    free(t32);
    return rc == 0 ? 0 : fail(&err);
}

static int cmd_read(char **a) /* PATTERN B T RANK WORLD STEPS */
{
    int B = atoi(a[1]), T = atoi(a[2]), rank = atoi(a[3]), world = atoi(a[4]);
    long steps = atol(a[5]);
    bmt_error_t err;
    data_loader_t *l = data_loader_open(a[0], B, T, rank, world, &err);
    if (l == NULL)
        return fail(&err);
    size_t bt = (size_t)B * (size_t)T;
    int32_t *in = malloc(bt * sizeof(*in)), *tg = malloc(bt * sizeof(*tg));
    for (long s = 0; s < steps; s++) {
        if (data_loader_next(l, in, tg, &err) != 0) {
            free(in);
            free(tg);
            data_loader_destroy(l);
            return fail(&err);
        }
        int shard;
        int64_t pos;
        data_loader_position(l, &shard, &pos);
        printf("%d %lld |", shard, (long long)pos);
        for (size_t i = 0; i < bt; i++)
            printf(" %d", in[i]);
        printf(" |");
        for (size_t i = 0; i < bt; i++)
            printf(" %d", tg[i]);
        printf("\n");
    }
    free(in);
    free(tg);
    data_loader_destroy(l);
    return 0;
}

static int cmd_decode(const char *path)
{
    size_t len = 0;
    uint8_t *b = slurp(path, &len);
    bmt_error_t err;
    int64_t n = 0;
    if (b == NULL || data_shard_check_header(b, len, (int64_t)len, &n, &err) != 0) {
        free(b);
        if (b == NULL)
            snprintf(err.text, sizeof(err.text), "%s: cannot read", path);
        return fail(&err);
    }
    int32_t *t = malloc((size_t)(n ? n : 1) * sizeof(*t));
    for (int64_t i = 0; i < n; i++)
        t[i] = b[DATA_SHARD_HEADER_BYTES + 2 * i] | b[DATA_SHARD_HEADER_BYTES + 2 * i + 1] << 8;
    int want = data_decode_bytes(t, (int)n, NULL, 0);
    char *out = malloc((size_t)want + 1);
    int got = data_decode_bytes(t, (int)n, out, (size_t)want + 1);
    fwrite(out, 1, (size_t)got, stdout);
    free(out);
    free(t);
    free(b);
    return got == want ? 0 : 1;
}

int main(int argc, char **argv)
{
    bmt_error_t err;
    if (argc == 4 && strcmp(argv[1], "write") == 0)
        return cmd_write(argv[2], argv[3], 2);
    if (argc == 4 && strcmp(argv[1], "write32") == 0)
        return cmd_write(argv[2], argv[3], 4);
    if (argc == 8 && strcmp(argv[1], "read") == 0)
        return cmd_read(argv + 2);
    if (argc == 5 && strcmp(argv[1], "tokenize") == 0)
        return data_tokenize_file(argv[2], argv[3], atof(argv[4]), &err) == 0 ? 0 : fail(&err);
    if (argc == 3 && strcmp(argv[1], "decode") == 0)
        return cmd_decode(argv[2]);
    return usage();
}
