/* tests/unit/test_gpt2_data.c — llm.c token shards, the per-rank reader and the
 * byte-level tokenizer (examples/common/data.h).
 *
 * The reader is checked against the formula of data.h recomputed here from the
 * shard contents (token i of shard s is (i + 50000*s) % 65000, so values above
 * 32767 check that tokens are unsigned): every rank's inputs and targets at every
 * step of two epochs over three shards of different sizes, that the ranks of
 * one step tile one global batch, the shard switches and the wraparound. Bad
 * headers are a table of expected failures, first with no I/O, then through
 * files; each message must name the file. /proc/self/io shows that one step
 * reads exactly B*T+1 tokens. Writes must be all or nothing, and a tokenizing
 * that fails leaves the files it would have replaced as they were.
 * data_loader_digest tells shard lists apart by name, size and width.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/data.h"
#include "tap.h"

static char tmpdir[128];

static char *path_in(const char *name)
{
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static void write_bytes(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Entries of dir whose name contains ".tmp." (leftover temporary files). */
static int count_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".tmp.") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* A raw shard: header words magic, version, count, then ntok_written tokens
 * 0, 1, 2, ... (and nothing else), or only head_len header bytes when
 * head_len < 1024. */
static void raw_shard(const char *path, int magic, int version, int count, long ntok_written,
                      size_t head_len)
{
    size_t len = DATA_SHARD_HEADER_BYTES + 2 * (size_t)ntok_written;
    uint8_t *b = calloc(1, len);
    int32_t w[3] = { magic, version, count };
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = (uint8_t)((uint32_t)w[i] >> (8 * k));
    for (long i = 0; i < ntok_written; i++)
        b[DATA_SHARD_HEADER_BYTES + 2 * i] = (uint8_t)i;
    write_bytes(path, b, head_len < DATA_SHARD_HEADER_BYTES ? head_len : len);
    free(b);
}

/* ---------------------------------------------------------------- header, no I/O */

static void test_header_pure(void)
{
    uint8_t h[DATA_SHARD_HEADER_BYTES];
    bmt_error_t err;
    int64_t n = -7;

    data_shard_make_header(h, 12345);
    is_int(h[0] | h[1] << 8 | h[2] << 16 | h[3] << 24, 20240520, "header word 0 is the magic (LE)");
    is_int(h[4] | h[5] << 8, 1, "header word 1 is the version");
    is_int(h[8] | h[9] << 8 | h[10] << 16, 12345, "header word 2 is the token count");
    int zeros = 1;
    for (int i = 12; i < DATA_SHARD_HEADER_BYTES; i++)
        zeros &= h[i] == 0;
    ok(zeros, "header words 3..255 are zero");
    ok(data_shard_check_header(h, sizeof(h), 1024 + 2 * 12345, &n, &err) == 0 && n == 12345,
       "a made header checks, count 12345");
    data_shard_make_header(h, 0);
    ok(data_shard_check_header(h, sizeof(h), 1024, &n, &err) == 0 && n == 0,
       "a header of 0 tokens checks");
    int width = -7;
    data_shard_make_header_w(h, 777, 4);
    is_int(h[0] | h[1] << 8 | h[2] << 16 | h[3] << 24, 20240801,
           "a 4-byte shard's magic is llm.c's llama-3 one");
    is_int(h[4] | h[5] << 8, 7, "and its version 7");
    ok(data_shard_header(h, sizeof(h), 1024 + 4 * 777, &n, &width, &err) == 0 && n == 777 &&
           width == 4,
       "a 4-byte header checks against 1024 + 4 n bytes, width 4");
    n = -7;
    ok(data_shard_header(h, sizeof(h), 1024 + 2 * 777, &n, &width, &err) == -1 && n == -7 &&
           width == 4 &&
           strstr(err.text, "777 tokens of 4 bytes need 4132 bytes but the file has 2578"),
       "a 4-byte header against 2-byte tokens' size is refused");
    data_shard_make_header(h, 5);
    ok(data_shard_header(h, sizeof(h), 1024 + 10, &n, &width, &err) == 0 && n == 5 && width == 2,
       "a 2-byte header says width 2");

    static const struct {
        const char *what;
        int magic, version, count;
        size_t head_len;
        long long file_size;
        const char *want; /* substring of the message */
    } bad[] = {
        { "wrong magic", 20240521, 1, 10, 1024, 1044, "bad magic 20240521" },
        { "llama-3 magic, 2-byte size", 20240801, 7, 10, 1024, 1044, "need 1064 bytes" },
        { "llama-3 magic, gpt-2 version", 20240801, 1, 10, 1024, 1064,
          "unsupported version 1, want 7 for magic 20240801" },
        { "gpt-2 magic, llama-3 version", 20240520, 7, 10, 1024, 1044,
          "unsupported version 7, want 1" },
        { "wrong version", 20240520, 2, 10, 1024, 1044, "unsupported version 2" },
        { "count larger than the file", 20240520, 1, 11, 1024, 1044, "count larger than the file" },
        { "count smaller than the file", 20240520, 1, 9, 1024, 1044,
          "count smaller than the file" },
        { "negative count", 20240520, 1, -1, 1024, 1024, "negative token count" },
        { "header cut short (head_len)", 20240520, 1, 0, 1023, 1024, "truncated header: 1023" },
        { "header cut short (file size)", 20240520, 1, 0, 1024, 500, "truncated header: 500" },
        { "empty file", 20240520, 1, 0, 0, 0, "truncated header: 0" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(h, 0, sizeof(h));
        int32_t w[3] = { bad[i].magic, bad[i].version, bad[i].count };
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++)
                h[4 * j + k] = (uint8_t)((uint32_t)w[j] >> (8 * k));
        n = -7;
        strcpy(err.text, "");
        int rc = data_shard_check_header(h, bad[i].head_len, bad[i].file_size, &n, &err);
        ok(rc == -1 && n == -7 && strstr(err.text, bad[i].want) != NULL, "check_header refuses: %s",
           bad[i].what);
        if (strstr(err.text, bad[i].want) == NULL)
            diag("message: '%s', want '%s'", err.text, bad[i].want);
    }
}

/* ---------------------------------------------------------------- open failures via files */

static void test_open_errors(void)
{
    enum {
        B = 2,
        T = 5
    };
    static const struct {
        const char *file; /* created in tmpdir; NULL: none */
        int magic, version, count;
        long written;
        size_t head_len;
        int world;
        const char *pattern; /* NULL: the file itself */
        const char *want;
    } bad[] = {
        { "magic.bin", 12345, 1, 40, 40, 1024, 1, NULL, "bad magic 12345" },
        { "version.bin", 20240520, 3, 40, 40, 1024, 1, NULL, "unsupported version 3" },
        { "larger.bin", 20240520, 1, 41, 40, 1024, 1, NULL, "count larger than the file" },
        { "smaller.bin", 20240520, 1, 39, 40, 1024, 1, NULL, "count smaller than the file" },
        { "header.bin", 20240520, 1, 40, 40, 700, 1, NULL, "truncated header: 700" },
        { "empty.bin", 20240520, 1, 0, 0, 0, 1, NULL, "truncated header: 0" },
        { "short.bin", 20240520, 1, 10, 10, 1024, 1, NULL, "fewer than one global batch" },
        { "short3.bin", 20240520, 1, 30, 30, 1024, 3, NULL, "world*B*T+1 = 3*2*5+1 = 31" },
        { NULL, 0, 0, 0, 0, 0, 1, "missing.bin", "No such file or directory" },
        { NULL, 0, 0, 0, 0, 0, 1, "nomatch_*.bin", "no shard file matches" },
        { NULL, 0, 0, 0, 0, 0, 1, "nodir/x.bin", "No such file or directory" },
    };
    bmt_error_t err;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *name = bad[i].file ? bad[i].file : bad[i].pattern;
        char path[256];
        snprintf(path, sizeof(path), "%s", path_in(name));
        if (bad[i].file)
            raw_shard(path, bad[i].magic, bad[i].version, bad[i].count, bad[i].written,
                      bad[i].head_len);
        strcpy(err.text, "");
        data_loader_t *l = data_loader_open(path, B, T, 0, bad[i].world, &err);
        ok(l == NULL && strstr(err.text, bad[i].want) && strstr(err.text, name),
           "open refuses %s, naming it", name);
        if (!(strstr(err.text, bad[i].want) && strstr(err.text, name)))
            diag("message: '%s', want '%s' and '%s'", err.text, bad[i].want, name);
        data_loader_destroy(l);
        if (bad[i].file)
            unlink(path);
    }

    /* One bad shard among good ones: the error names that one. */
    mkdir(path_in("mixed"), 0755);
    raw_shard(path_in("mixed/a.bin"), 20240520, 1, 40, 40, 1024);
    raw_shard(path_in("mixed/b.bin"), 20240520, 1, 41, 40, 1024);
    raw_shard(path_in("mixed/c.bin"), 20240520, 1, 40, 40, 1024);
    data_loader_t *l = data_loader_open(path_in("mixed/*.bin"), B, T, 0, 1, &err);
    ok(l == NULL && strstr(err.text, "mixed/b.bin") && strstr(err.text, "larger"),
       "a glob with one bad shard names that shard: %s", err.text);
    data_loader_destroy(l);

    /* A directory matched by the pattern. */
    mkdir(path_in("mixed/d.bin"), 0755);
    unlink(path_in("mixed/b.bin"));
    l = data_loader_open(path_in("mixed/*.bin"), B, T, 0, 1, &err);
    ok(l == NULL && strstr(err.text, "d.bin: not a regular file"), "a directory is refused: %s",
       err.text);
    data_loader_destroy(l);
    rmdir(path_in("mixed/d.bin"));

    /* Exactly world*B*T+1 tokens is enough. */
    raw_shard(path_in("exact.bin"), 20240520, 1, 31, 31, 1024);
    l = data_loader_open(path_in("exact.bin"), B, T, 2, 3, &err);
    ok(l != NULL, "a shard of exactly world*B*T+1 = 31 tokens opens");
    data_loader_destroy(l);

    static const struct {
        int B, T, rank, world;
    } args[] = {
        { 0, 5, 0, 1 }, { 2, 0, 0, 1 },  { 2, 5, 0, 0 },
        { 2, 5, 3, 3 }, { 2, 5, -1, 3 }, { 65536, 65536, 0, 1 },
    };
    for (size_t i = 0; i < sizeof(args) / sizeof(args[0]); i++) {
        strcpy(err.text, "");
        l = data_loader_open(path_in("exact.bin"), args[i].B, args[i].T, args[i].rank,
                             args[i].world, &err);
        ok(l == NULL && strstr(err.text, "exact.bin"), "open refuses B=%d T=%d rank=%d world=%d",
           args[i].B, args[i].T, args[i].rank, args[i].world);
        data_loader_destroy(l);
    }
    l = data_loader_open(NULL, 2, 5, 0, 1, &err);
    ok(l == NULL && err.text[0], "open refuses a NULL pattern");
    data_loader_destroy(NULL);
    ok(1, "destroy(NULL) is a no-op");
}

/* ---------------------------------------------------------------- next() across ranks */

enum {
    W = 3,
    BB = 2,
    TT = 5,
    BT = BB * TT,
    G = W * BT,
    NSHARD = 3
};
/* 2333, 2 and 1 global batches: 70001 leaves 10 tokens unused; 90 = 3*G holds only
 * 2 (a third would need token 90 as its last target); 31 = G + 1 holds 1. */
static const long shard_n[NSHARD] = { 70001, 90, 31 };

static int tok(int s, long i) { return (int)((i + 50000L * s) % 65000); }

static void make_shards(void)
{
    mkdir(path_in("ds"), 0755);
    /* Written last-first: the loader must sort, not take creation order. */
    for (int s = NSHARD - 1; s >= 0; s--) {
        uint16_t *t = malloc((size_t)shard_n[s] * sizeof(*t));
        for (long i = 0; i < shard_n[s]; i++)
            t[i] = (uint16_t)tok(s, i);
        char name[64];
        snprintf(name, sizeof(name), "ds/tok_%03d.bin", s);
        bmt_error_t err;
        if (data_write_shard(path_in(name), t, (size_t)shard_n[s], &err) != 0) {
            diag("%s", err.text);
            exit(2);
        }
        free(t);
    }
}

/* The (shard, pos) of every global batch of one epoch, by the formula. */
static int epoch_plan(int *ps, long *pp, int cap)
{
    int k = 0;
    for (int s = 0; s < NSHARD; s++)
        for (long p = 0; p + G + 1 <= shard_n[s]; p += G) {
            if (k < cap) {
                ps[k] = s;
                pp[k] = p;
            }
            k++;
        }
    return k;
}

static void test_ranks(void)
{
    bmt_error_t err;
    static int ps[4000];
    static long pp[4000];
    int per_epoch = epoch_plan(ps, pp, 4000);
    is_int(per_epoch, 2333 + 2 + 1, "one epoch is 2336 global batches");
    int steps = 2 * per_epoch + 5;

    data_loader_t *l[W];
    for (int r = 0; r < W; r++) {
        l[r] = data_loader_open(path_in("ds/tok_*.bin"), BB, TT, r, W, &err);
        if (!ok(l[r] != NULL, "rank %d of %d opens the three shards", r, W)) {
            diag("%s", err.text);
            return;
        }
    }
    is_int(data_loader_num_shards(l[0]), 3, "three shards");
    is_int(data_loader_tokens(l[0]), 70001 + 90 + 31, "tokens() counts all shards");
    is_int(data_loader_shard_tokens(l[0], 1), 90, "shard_tokens(1)");
    is_int(data_loader_shard_tokens(l[0], 3), -1, "shard_tokens(3) is out of range");
    ok(data_loader_shard_path(l[0], 1) &&
           strcmp(data_loader_shard_path(l[0], 1), path_in("ds/tok_001.bin")) == 0,
       "shard_path(1) is the second match, as glob gave it");
    ok(data_loader_shard_path(l[0], 3) == NULL && data_loader_shard_path(l[0], -1) == NULL &&
           data_loader_shard_path(NULL, 0) == NULL,
       "shard_path out of range is NULL");
    is_int(data_loader_batches(l[0]), per_epoch,
           "batches() is the distinct global batches before the loader starts again");

    long bad_formula[W] = { 0 }, bad_pos = 0, bad_tile = 0, bad_shift = 0, fails = 0;
    int32_t in[W][BT], tg[W][BT];
    int32_t first_in[W][BT];
    int seen_switch1 = 0, seen_switch2 = 0, seen_wrap = 0;
    for (int step = 0; step < steps; step++) {
        int k = step % per_epoch, s = ps[k];
        long p = pp[k];
        for (int r = 0; r < W; r++) {
            if (data_loader_next(l[r], in[r], tg[r], &err) != 0) {
                if (fails++ == 0)
                    diag("step %d rank %d: %s", step, r, err.text);
                continue;
            }
            for (int i = 0; i < BT; i++) {
                long at = p + (long)r * BT + i;
                bad_formula[r] += in[r][i] != tok(s, at) || tg[r][i] != tok(s, at + 1);
            }
            int ss;
            int64_t pos;
            data_loader_position(l[r], &ss, &pos);
            bad_pos += ss != s || pos != p + G;
        }
        /* Ranks 0, 1, 2 in order tile tokens [p, p + G) of shard s; targets are
         * inputs shifted by one, across rank boundaries too. */
        for (int j = 0; j < G; j++) {
            bad_tile += in[j / BT][j % BT] != tok(s, p + j);
            int32_t next_in = j + 1 < G ? in[(j + 1) / BT][(j + 1) % BT] : tok(s, p + G);
            bad_shift += tg[j / BT][j % BT] != next_in;
        }
        if (step == 0)
            memcpy(first_in, in, sizeof(in));
        if (step == 2333)
            seen_switch1 = in[0][0] == tok(1, 0) && in[2][BT - 1] == tok(1, G - 1);
        if (step == 2335)
            seen_switch2 = in[0][0] == tok(2, 0) && tg[2][BT - 1] == tok(2, G);
        if (step == per_epoch)
            seen_wrap = memcmp(in, first_in, sizeof(in)) == 0;
    }
    is_int(fails, 0, "every next() succeeds");
    for (int r = 0; r < W; r++)
        is_int(bad_formula[r], 0, "rank inputs/targets = tokens [p + r*B*T, ... + B*T + 1)");
    is_int(bad_pos, 0, "position after each step is (shard, p + world*B*T) on every rank");
    is_int(bad_tile, 0, "the ranks' inputs of a step tile world*B*T consecutive tokens");
    is_int(bad_shift, 0, "targets are the inputs shifted by one token, across ranks");
    ok(seen_switch1, "step 2333 (70000 = 2333*30 + 10: no room for 2334) starts shard 1");
    ok(seen_switch2, "step 2335 starts shard 2 (90 tokens hold 2 batches)");
    ok(seen_wrap, "after the last shard the first batch comes again (next epoch)");

    /* ------------------------------------------------------------ position / seek */
    int s;
    int64_t pos;
    data_loader_reset(l[1]);
    data_loader_position(l[1], &s, &pos);
    ok(s == 0 && pos == 0, "reset: position (0, 0)");
    data_loader_next(l[1], in[1], tg[1], &err);
    ok(in[1][0] == tok(0, BT) && tg[1][BT - 1] == tok(0, 2 * BT), "after reset: the first batch");

    ok(data_loader_seek(l[1], 1, 30, &err) == 0, "seek(1, 30)");
    data_loader_next(l[1], in[1], tg[1], &err);
    ok(in[1][0] == tok(1, 40) && tg[1][9] == tok(1, 50), "seek(1, 30): rank 1 reads 40..50");
    ok(data_loader_seek(l[1], 1, 65, &err) == 0, "seek(1, 65): 65 + 31 > 90, no batch fits");
    data_loader_next(l[1], in[1], tg[1], &err);
    data_loader_position(l[1], &s, &pos);
    ok(in[1][0] == tok(2, 10) && s == 2 && pos == G, "... so next() moves on to shard 2");
    ok(data_loader_seek(l[1], 2, 31, &err) == 0, "seek to the end of the last shard");
    data_loader_next(l[1], in[1], tg[1], &err);
    data_loader_position(l[1], &s, &pos);
    ok(in[1][0] == tok(0, 10) && s == 0 && pos == G, "... so next() wraps to shard 0");
    ok(data_loader_seek(l[1], 0, 7, &err) == 0, "seek(0, 7): not a multiple of world*B*T");
    data_loader_next(l[1], in[1], tg[1], &err);
    ok(in[1][0] == tok(0, 17) && tg[1][9] == tok(0, 27), "seek(0, 7): rank 1 reads 17..27");

    data_loader_seek(l[1], 1, 60, &err);
    static const struct {
        int shard;
        int64_t pos;
        const char *want;
    } bad_seek[] = {
        { 3, 0, "shard 3 out of range" },
        { -1, 0, "shard -1 out of range" },
        { 0, -1, "position -1 outside" },
        { 1, 91, "tok_001.bin, which has 90 tokens" },
    };
    for (size_t i = 0; i < sizeof(bad_seek) / sizeof(bad_seek[0]); i++) {
        strcpy(err.text, "");
        int rc = data_loader_seek(l[1], bad_seek[i].shard, bad_seek[i].pos, &err);
        data_loader_position(l[1], &s, &pos);
        ok(rc == -1 && s == 1 && pos == 60 && strstr(err.text, bad_seek[i].want),
           "seek(%d, %lld) refused, position unchanged", bad_seek[i].shard,
           (long long)bad_seek[i].pos);
        if (!strstr(err.text, bad_seek[i].want))
            diag("message: '%s'", err.text);
    }

    /* Resume: a fresh loader seeked to a saved position continues identically,
     * also from the end of a shard (the last batch of shard 0 just served). */
    static const int resume_after[] = { 100, 2333 };
    for (int c = 0; c < 2; c++) {
        data_loader_reset(l[2]);
        for (int i = 0; i < resume_after[c]; i++)
            data_loader_next(l[2], in[2], tg[2], &err);
        data_loader_position(l[2], &s, &pos);
        data_loader_t *fresh = data_loader_open(path_in("ds/tok_*.bin"), BB, TT, 2, W, &err);
        int same = fresh && data_loader_seek(fresh, s, pos, &err) == 0;
        for (int i = 0; same && i < 10; i++) {
            int32_t a[BT], b[BT];
            data_loader_next(l[2], in[2], tg[2], &err);
            data_loader_next(fresh, a, b, &err);
            same = memcmp(a, in[2], sizeof(a)) == 0 && memcmp(b, tg[2], sizeof(b)) == 0;
        }
        ok(same, "resume after %d steps from (%d, %lld): the next 10 batches are the same",
           resume_after[c], s, (long long)pos);
        data_loader_destroy(fresh);
    }

    /* Reads: one step in the middle of a shard reads exactly (B*T+1)*2 bytes. */
    int iofd = open("/proc/self/io", O_RDONLY);
    if (iofd >= 0) {
        long long r0 = 0, r1 = 0, len0 = 0;
        char buf[1024];
        ssize_t got;
        data_loader_seek(l[0], 0, 300, &err);
        data_loader_next(l[0], in[0], tg[0], &err); /* the file is open now */
        got = pread(iofd, buf, sizeof(buf) - 1, 0);
        buf[got > 0 ? got : 0] = '\0';
        len0 = got;
        sscanf(buf, "rchar: %lld", &r0);
        data_loader_next(l[0], in[0], tg[0], &err);
        got = pread(iofd, buf, sizeof(buf) - 1, 0);
        buf[got > 0 ? got : 0] = '\0';
        sscanf(buf, "rchar: %lld", &r1);
        is_int(r1 - r0 - len0, (BT + 1) * 2, "one next() reads (B*T+1)*2 bytes (/proc/self/io)");
        close(iofd);
    } else {
        ok(1, "# skip /proc/self/io is not readable");
    }

    /* A shard that changed under the loader is caught when it is opened again. */
    raw_shard(path_in("ds/tok_001.bin"), 20240520, 1, 50, 50, 1024);
    data_loader_seek(l[0], 1, 0, &err);
    strcpy(err.text, "");
    data_loader_position(l[0], &s, &pos);
    ok(data_loader_next(l[0], in[0], tg[0], &err) == -1 && strstr(err.text, "tok_001.bin"),
       "a shard replaced since open is refused: %s", err.text);
    int s2;
    int64_t pos2;
    data_loader_position(l[0], &s2, &pos2);
    ok(s2 == s && pos2 == pos, "a failed next() leaves the position");
    unlink(path_in("ds/tok_001.bin"));
    strcpy(err.text, "");
    ok(data_loader_next(l[0], in[0], tg[0], &err) == -1 && strstr(err.text, "tok_001.bin") &&
           strstr(err.text, "No such file"),
       "a shard removed since open is refused: %s", err.text);
    for (int r = 0; r < W; r++)
        data_loader_destroy(l[r]);
}

/* ---------------------------------------------------------------- writer, tokenizer */

static int read_shard(const char *path, uint16_t *out, long cap, long *n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    uint8_t head[DATA_SHARD_HEADER_BYTES];
    int64_t nt;
    bmt_error_t err;
    if (fread(head, 1, sizeof(head), f) != sizeof(head) ||
        data_shard_check_header(head, sizeof(head), file_size(path), &nt, &err) != 0 || nt > cap) {
        fclose(f);
        return -1;
    }
    for (long i = 0; i < nt; i++) {
        uint8_t b[2];
        if (fread(b, 1, 2, f) != 2) {
            fclose(f);
            return -1;
        }
        out[i] = (uint16_t)(b[0] | b[1] << 8);
    }
    fclose(f);
    *n = (long)nt;
    return 0;
}

static void test_tokenizer(void)
{
    bmt_error_t err;
    /* A text with ASCII, newlines, tabs and UTF-8: it decodes to itself. */
    const char *para = "First Citizen:\tBefore we proceed any further, hear me speak.\n"
                       "All: Speak, speak. \xc3\xa9t\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80 ~!\n";
    size_t plen = strlen(para), n = 0;
    static char text[8192];
    while (n + plen < sizeof(text) - 1 - 7) {
        memcpy(text + n, para, plen);
        n += plen;
    }
    memcpy(text + n, "THE END", 7); /* not a multiple of anything */
    n += 7;
    text[n] = '\0';
    write_bytes(path_in("text.txt"), text, n);

    ok(data_tokenize_file(path_in("text.txt"), path_in("tk"), 0.1, &err) == 0,
       "tokenize %zu bytes, val 0.1", n);
    size_t nv = (size_t)(0.1 * (double)n), nt = n - nv;
    is_int(file_size(path_in("tk_train.bin")), 1024 + 2 * (long long)nt,
           "train shard: 1024 + 2*(n - floor(0.1 n)) bytes");
    is_int(file_size(path_in("tk_val.bin")), 1024 + 2 * (long long)nv,
           "val shard: 1024 + 2*floor(0.1 n) bytes");
    static uint16_t tk[8192];
    static int32_t t32[8192];
    static char back[16384];
    long ntr = 0, nva = 0;
    ok(read_shard(path_in("tk_train.bin"), tk, 8192, &ntr) == 0 && ntr == (long)nt,
       "train shard has a valid header");
    int same = 1;
    for (long i = 0; i < ntr; i++) {
        same &= tk[i] == (uint8_t)text[i];
        t32[i] = tk[i];
    }
    ok(same, "train tokens are the first n - v bytes");
    ok(read_shard(path_in("tk_val.bin"), tk, 8192, &nva) == 0 && nva == (long)nv,
       "val shard has a valid header");
    same = 1;
    for (long i = 0; i < nva; i++) {
        same &= tk[i] == (uint8_t)text[nt + i];
        t32[ntr + i] = tk[i];
    }
    ok(same, "val tokens are the last v bytes");
    int len = data_decode_bytes(t32, (int)(ntr + nva), back, sizeof(back));
    ok(len == (int)n && memcmp(back, text, n) == 0 && back[n] == '\0',
       "decode(train) + decode(val) == text");
    is_int(count_tmp(tmpdir), 0, "no temporary file is left");

    /* Every byte value round-trips through the shards. */
    uint8_t all[512];
    for (int i = 0; i < 512; i++)
        all[i] = (uint8_t)(i * 7 + 3);
    write_bytes(path_in("all.bin"), all, sizeof(all));
    ok(data_tokenize_file(path_in("all.bin"), path_in("all"), 0.25, &err) == 0,
       "tokenize 512 bytes of every value");
    read_shard(path_in("all_train.bin"), tk, 8192, &ntr);
    read_shard(path_in("all_val.bin"), tk + 384, 8192, &nva);
    same = ntr == 384 && nva == 128;
    for (int i = 0; same && i < 512; i++)
        same = tk[i] == all[i];
    ok(same, "all 256 byte values are their own tokens (384 train + 128 val)");

    /* val_fraction 0: an empty val shard. */
    ok(data_tokenize_file(path_in("text.txt"), path_in("nv"), 0.0, &err) == 0 &&
           file_size(path_in("nv_train.bin")) == 1024 + 2 * (long long)n &&
           file_size(path_in("nv_val.bin")) == 1024,
       "val_fraction 0: all bytes in train, an empty val shard");

    /* Refusals leave no file. */
    static const struct {
        const char *text, *prefix;
        double frac;
        const char *want;
    } bad[] = {
        { "text.txt", "b1", -0.1, "val_fraction must be in [0, 1)" },
        { "text.txt", "b2", 1.0, "val_fraction must be in [0, 1)" },
        { "text.txt", "b3", NAN, "val_fraction must be in [0, 1)" },
        { "missing.txt", "b4", 0.1, "missing.txt: No such file" },
        { "empty.txt", "b5", 0.1, "nothing for the train part" },
        { "text.txt", "text.txt/b7", 0.1, "text.txt is not a folder" },
        { "text.txt", "text.txt/sub/b7", 0.1, "text.txt is not a folder" },
        { "ds", "b8", 0.1, "ds: not a regular file" },
    };
    write_bytes(path_in("empty.txt"), "", 0);
    mkdir(path_in("ds"), 0755);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char tp[256], pp[256], trp[300], vp[300];
        snprintf(tp, sizeof(tp), "%s", path_in(bad[i].text));
        snprintf(pp, sizeof(pp), "%s", path_in(bad[i].prefix));
        snprintf(trp, sizeof(trp), "%s_train.bin", pp);
        snprintf(vp, sizeof(vp), "%s_val.bin", pp);
        strcpy(err.text, "");
        int rc = data_tokenize_file(tp, pp, bad[i].frac, &err);
        ok(rc == -1 && strstr(err.text, bad[i].want) && !exists(trp) && !exists(vp),
           "tokenize refuses (%s) and writes nothing", bad[i].want);
        if (!strstr(err.text, bad[i].want))
            diag("message: '%s'", err.text);
    }

    /* Folders of the prefix that do not exist are made, once the text has been
     * opened and checked. */
    ok(data_tokenize_file(path_in("text.txt"), path_in("newdir/deeper/b9"), 0.1, &err) == 0 &&
           exists(path_in("newdir/deeper/b9_train.bin")) &&
           exists(path_in("newdir/deeper/b9_val.bin")),
       "tokenize makes the folders of its prefix that do not exist");
    ok(!exists(path_in("nodir")) &&
           data_tokenize_file(path_in("missing.txt"), path_in("nodir/b6"), 0.1, &err) == -1 &&
           !exists(path_in("nodir")),
       "a tokenize refused before writing makes no folder");

    /* The second rename fails (the val name is a directory): the pair is
     * published whole or not at all. */
    mkdir(path_in("pair_val.bin"), 0755);
    strcpy(err.text, "");
    ok(data_tokenize_file(path_in("text.txt"), path_in("pair"), 0.1, &err) == -1 &&
           strstr(err.text, "pair_val.bin: rename"),
       "tokenize fails when the val name is a directory: %s", err.text);
    ok(!exists(path_in("pair_train.bin")), "... and the train shard is removed again");
    is_int(count_tmp(tmpdir), 0, "... and no temporary file is left");
    rmdir(path_in("pair_val.bin"));

    /* The same over an earlier pair (a --prepare run again): the earlier train
     * shard is put back as it was, not removed. */
    ok(data_tokenize_file(path_in("all.bin"), path_in("again"), 0.25, &err) == 0,
       "tokenize into again_*");
    unlink(path_in("again_val.bin"));
    mkdir(path_in("again_val.bin"), 0755);
    strcpy(err.text, "");
    ok(data_tokenize_file(path_in("text.txt"), path_in("again"), 0.1, &err) == -1 &&
           strstr(err.text, "again_val.bin: rename"),
       "tokenize over an earlier pair fails when the val name is a directory: %s", err.text);
    ntr = 0;
    same = read_shard(path_in("again_train.bin"), tk, 8192, &ntr) == 0 && ntr == 384;
    for (int i = 0; same && i < 384; i++)
        same = tk[i] == all[i];
    ok(same, "... and the earlier train shard is there as it was (%ld tokens)", ntr);
    is_int(count_tmp(tmpdir), 0, "... and no temporary file is left");
    rmdir(path_in("again_val.bin"));

    if (geteuid() != 0) {
        mkdir(path_in("ro"), 0555);
        ok(data_tokenize_file(path_in("text.txt"), path_in("ro/x"), 0.1, &err) == -1 &&
               strstr(err.text, "Permission denied") && !exists(path_in("ro/x_train.bin")),
           "a non-writable directory: refused, nothing written");
    } else {
        ok(1, "# skip non-writable directory: root writes anywhere");
    }
}

/* A step of accum micro-batches (data_loader_set_accum) reads what one batch of
 * accum times the rows reads, shard ends and epochs included: the shard end is
 * decided per step, not per micro-batch (which made the step's micro-batches
 * straddle shards 1 and 2, whose 90 and 31 tokens hold 8 and 3 micro-batches). */
static void test_accum(void)
{
    bmt_error_t err;
    data_loader_t *m = data_loader_open(path_in("ds/tok_*.bin"), BB, TT, 0, 1, &err);
    data_loader_t *w = data_loader_open(path_in("ds/tok_*.bin"), 3 * BB, TT, 0, 1, &err);
    if (!ok(m && w, "a loader of B %d and one of B %d", BB, 3 * BB)) {
        data_loader_destroy(m);
        data_loader_destroy(w);
        return;
    }
    ok(data_loader_set_accum(m, 4, &err) < 0 &&
           strstr(err.text, "tok_002.bin: 31 tokens, fewer than one global batch needs: "
                            "accum*world*B*T+1 = 4*1*2*5+1 = 41") != NULL,
       "accum 4 (41 tokens a step) is refused naming the 31-token shard: %s", err.text);
    ok(data_loader_set_accum(m, 0, &err) < 0, "accum 0 is refused");
    ok(data_loader_set_accum(m, 3, &err) == 0, "accum 3 (31 tokens a step) fits every shard");
    is_int(data_loader_batches(m), data_loader_batches(w), "as many global batches as B x 3");
    int32_t in[3 * BT], tg[3 * BT], win[3 * BT], wtg[3 * BT];
    int steps = 2 * (int)data_loader_batches(w) + 3, bad = -1;
    for (int k = 0; k < steps && bad < 0; k++) {
        for (int a = 0; a < 3 && bad < 0; a++)
            if (data_loader_next(m, in + a * BT, tg + a * BT, &err) != 0)
                bad = k;
        int s1, s2;
        int64_t p1, p2;
        data_loader_position(m, &s1, &p1);
        if (bad >= 0 || data_loader_next(w, win, wtg, &err) != 0 ||
            memcmp(in, win, sizeof(in)) != 0 || memcmp(tg, wtg, sizeof(tg)) != 0)
            bad = k;
        data_loader_position(w, &s2, &p2);
        if (s1 != s2 || p1 != p2)
            bad = k;
    }
    ok(bad == -1,
       "%d steps of 3 micro-batches (two epochs) are the batches of B x 3, and their "
       "positions (first difference: step %d)",
       steps, bad);
    data_loader_destroy(m);
    data_loader_destroy(w);
}

static void test_write_shard(void)
{
    bmt_error_t err;
    uint16_t t[1000];
    for (int i = 0; i < 1000; i++)
        t[i] = (uint16_t)(65535 - i * 61);
    ok(data_write_shard(path_in("w.bin"), t, 1000, &err) == 0, "write a shard of 1000 tokens");
    static uint16_t back[1000];
    long n = 0;
    ok(read_shard(path_in("w.bin"), back, 1000, &n) == 0 && n == 1000 &&
           memcmp(back, t, sizeof(t)) == 0,
       "it reads back token for token (values up to 65535)");
    ok(data_write_shard(path_in("w0.bin"), NULL, 0, &err) == 0 &&
           file_size(path_in("w0.bin")) == 1024,
       "a shard of 0 tokens is a bare header");

    struct {
        const char *path, *want;
    } bad[] = {
        { "nodir/w.bin", "nodir/w.bin: cannot create a temporary file beside it: No such file" },
        { "w.bin/x.bin", "Not a directory" },
        { "adir", "adir: rename into place: Is a directory" },
    };
    mkdir(path_in("adir"), 0755);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strcpy(err.text, "");
        int rc = data_write_shard(path_in(bad[i].path), t, 1000, &err);
        ok(rc == -1 && strstr(err.text, bad[i].want), "write_shard refuses %s", bad[i].path);
        if (!strstr(err.text, bad[i].want))
            diag("message: '%s'", err.text);
    }
    struct stat st;
    ok(stat(path_in("adir"), &st) == 0 && S_ISDIR(st.st_mode), "the directory is left as it was");
    ok(!exists(path_in("nodir")), "no directory was created");
    is_int(count_tmp(tmpdir), 0, "no temporary file is left");
    ok(data_write_shard(path_in("x.bin"), NULL, 5, &err) == -1, "NULL tokens with n > 0 refused");
    ok(data_write_shard(path_in("x.bin"), t, (size_t)1 << 31, &err) == -1 &&
           strstr(err.text, "do not fit one shard") && !exists(path_in("x.bin")),
       "2^31 tokens refused");

    /* A write that fails half way (file size limit) keeps the old file whole. */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 1500; /* the header fits, the tokens do not */
    signal(SIGXFSZ, SIG_IGN);
    uint16_t t2[1000];
    for (int i = 0; i < 1000; i++)
        t2[i] = (uint16_t)i;
    int rc = -2;
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        strcpy(err.text, "");
        rc = data_write_shard(path_in("w.bin"), t2, 1000, &err);
        setrlimit(RLIMIT_FSIZE, &old);
    }
    ok(rc == -1 && strstr(err.text, "w.bin: writing tokens: File too large"),
       "a write that fails half way is reported: %s", err.text);
    ok(read_shard(path_in("w.bin"), back, 1000, &n) == 0 && n == 1000 &&
           memcmp(back, t, sizeof(t)) == 0,
       "... and the previous shard at that path is untouched");
    is_int(count_tmp(tmpdir), 0, "... and no temporary file is left");
}

static void test_decode(void)
{
    static const struct {
        int32_t t[8];
        int n;
        const char *want;
    } cases[] = {
        { { 'H', 'i', '\n', '\t', '\\' }, 5, "Hi\n\t\\" },
        { { 0, 1, 0x1f, 0x7f, '\r' }, 5, "\\x00\\x01\\x1f\\x7f\\x0d" },
        { { 0xc3, 0xa9 }, 2, "\xc3\xa9" },                         /* e acute */
        { { 0xe2, 0x80, 0x94 }, 3, "\xe2\x80\x94" },               /* em dash */
        { { 0xf0, 0x9f, 0x98, 0x80 }, 4, "\xf0\x9f\x98\x80" },     /* emoji */
        { { 0xc3 }, 1, "\\xc3" },                                  /* cut sequence */
        { { 0xc3, 'a' }, 2, "\\xc3a" },                            /* bad continuation */
        { { 0xc0, 0x80 }, 2, "\\xc0\\x80" },                       /* overlong NUL */
        { { 0xe0, 0x80, 0x80 }, 3, "\\xe0\\x80\\x80" },            /* overlong */
        { { 0xed, 0xa0, 0x80 }, 3, "\\xed\\xa0\\x80" },            /* surrogate */
        { { 0xf4, 0x90, 0x80, 0x80 }, 4, "\\xf4\\x90\\x80\\x80" }, /* past U+10FFFF */
        { { 0x80, 0xff, 'x' }, 3, "\\x80\\xffx" },                 /* stray bytes */
        { { 300, -1, 'a' }, 3, "<|300|><|-1|>a" },                 /* not bytes */
        { { 0 }, 0, "" },
    };
    char out[128];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int len = data_decode_bytes(cases[i].t, cases[i].n, out, sizeof(out));
        char what[64];
        snprintf(what, sizeof(what), "decode case %zu", i);
        is_str(out, cases[i].want, what);
        is_int(len, (long long)strlen(cases[i].want), "... returns its length");
    }
    /* Cutting: only whole pieces, always NUL-terminated, full length returned. */
    const int32_t t[] = { 'a', 'b', 1, 0xc3, 0xa9, 'z' }; /* "ab\x01" "é" "z": 2 + 4 + 2 + 1 */
    static const struct {
        size_t outlen;
        const char *want;
    } cut[] = { { 1, "" },
                { 3, "ab" },
                { 6, "ab" },
                { 7, "ab\\x01" },
                { 8, "ab\\x01" },
                { 9, "ab\\x01\xc3\xa9" },
                { 10, "ab\\x01\xc3\xa9z" } };
    for (size_t i = 0; i < sizeof(cut) / sizeof(cut[0]); i++) {
        memset(out, 'Q', sizeof(out));
        int len = data_decode_bytes(t, 6, out, cut[i].outlen);
        ok(len == 9 && strcmp(out, cut[i].want) == 0, "outlen %zu: '%s', returns 9", cut[i].outlen,
           cut[i].want);
    }
    ok(data_decode_bytes(t, 6, NULL, 0) == 9, "outlen 0 and out NULL: just the length");
    ok(data_decode_bytes(t, -1, out, sizeof(out)) == -1, "n < 0 refused");
    ok(data_decode_bytes(NULL, 3, out, sizeof(out)) == -1, "NULL tokens refused");
    ok(data_decode_bytes(t, 6, NULL, 5) == -1, "NULL out with outlen > 0 refused");
}

/* data_loader_digest: what the trainers compare across ranks. The same shards
 * in another folder give the same value; a shard missing, of another size or
 * width, or of another name give another. */
static void test_digest(void)
{
    bmt_error_t err;
    uint16_t t[100];
    uint32_t t32[100];
    for (int i = 0; i < 100; i++)
        t[i] = (uint16_t)i, t32[i] = (uint32_t)i;
    static const char *dirs[] = { "dg0", "dg1", "dgmiss", "dgsize", "dgwide", "dgname" };
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        mkdir(path_in(dirs[i]), 0755);
    char p[300];
    for (int d = 0; d < 2; d++) {
        snprintf(p, sizeof(p), "%s/a.bin", path_in(dirs[d]));
        data_write_shard(p, t, 100, &err);
        snprintf(p, sizeof(p), "%s/b.bin", path_in(dirs[d]));
        data_write_shard(p, t, 90, &err);
    }
    data_write_shard(path_in("dgmiss/b.bin"), t, 90, &err);
    data_write_shard(path_in("dgsize/a.bin"), t, 100, &err);
    data_write_shard(path_in("dgsize/b.bin"), t, 91, &err);
    data_write_shard(path_in("dgwide/a.bin"), t, 100, &err);
    data_write_shard_u32(path_in("dgwide/b.bin"), t32, 90, &err);
    data_write_shard(path_in("dgname/a.bin"), t, 100, &err);
    data_write_shard(path_in("dgname/c.bin"), t, 90, &err);
    uint64_t dg[6];
    for (int d = 0; d < 6; d++) {
        snprintf(p, sizeof(p), "%s/*.bin", path_in(dirs[d]));
        data_loader_t *l = data_loader_open(p, 2, 8, 0, 1, &err);
        dg[d] = data_loader_digest(l);
        if (l == NULL)
            diag("%s: %s", p, err.text);
        data_loader_destroy(l);
    }
    ok(dg[0] != 0 && dg[0] == dg[1], "digest: the same shards in another folder, the same value");
    for (int d = 2; d < 6; d++)
        ok(dg[d] != dg[0], "digest: %s differs", dirs[d]);
    ok(data_loader_digest(NULL) == 0, "digest(NULL) is 0");
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/gpt2data.XXXXXX", base && *base ? base : "/tmp");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    test_header_pure();
    test_open_errors();
    make_shards();
    test_ranks();
    test_accum();
    test_write_shard();
    test_tokenizer();
    test_decode();
    test_digest();
    nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return done_testing();
}
