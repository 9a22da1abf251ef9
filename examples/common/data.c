/* examples/common/data.c — llm.c token shards: header checks, atomic writes, a
 * reader that serves each rank its slice of every global batch, and the
 * byte-level tokenizer.
 *
 * Design. The reader keeps what llm.c's DataLoader keeps (the sorted shard list,
 * one open file, a position) but reads with pread, so a rank touches only the
 * B*T+1 tokens of its own slice: no rank ever reads the whole file or another
 * rank's tokens, and the only buffer is those B*T+1 tokens. The position counts
 * tokens of the whole world, not of one rank, so one checkpoint value serves
 * every rank. Bytes are decoded as little-endian explicitly, so a shard means the
 * same on any host. Both writers go through one path (temporary file beside the
 * target, fsync, rename), so an error or a crash never leaves a half-written
 * shard under the final name.
 */
#include "common/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* XXH3 from its header alone, as runtime/checksum.c takes it */
#define XXH_INLINE_ALL
#include <xxhash.h>

#define HEADER_BYTES DATA_SHARD_HEADER_BYTES

/* ---------------------------------------------------------------- errors */

static int data_err(bmt_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int data_err(bmt_error_t *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->text, sizeof(err->text), fmt, ap);
        va_end(ap);
        if (n >= (int)sizeof(err->text)) /* mark a cut message, as libbmt does */
            memcpy(err->text + sizeof(err->text) - 4, "...", 4);
    }
    return -1;
}

/* A path short enough to leave room for the cause in a message: the
 * path itself, or "..." and its tail (the tail tells shards apart). */
#define SHOWN_MAX 512
typedef struct {
    char s[SHOWN_MAX + 1];
} shown_t;

static shown_t shown(const char *path)
{
    shown_t out;
    size_t len = strlen(path);
    if (len <= SHOWN_MAX)
        memcpy(out.s, path, len + 1);
    else
        snprintf(out.s, sizeof(out.s), "...%s", path + len - (SHOWN_MAX - 3));
    return out;
}

/* ---------------------------------------------------------------- header */

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int64_t get_le32_signed(const uint8_t *p)
{
    uint32_t u = get_le32(p);
    return u <= INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296LL;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

int data_shard_header(const uint8_t *head, size_t head_len, int64_t file_size, int64_t *ntok,
                      int *token_bytes, bmt_error_t *err)
{
    int64_t have = file_size < (int64_t)head_len ? file_size : (int64_t)head_len;
    if (head == NULL || have < HEADER_BYTES)
        return data_err(err, "truncated header: %lld bytes, a shard starts with %d",
                        (long long)(have < 0 ? 0 : have), HEADER_BYTES);
    int64_t magic = get_le32_signed(head);
    if (magic != DATA_SHARD_MAGIC && magic != DATA_SHARD_MAGIC_U32)
        return data_err(err,
                        "bad magic %lld, want %d (2-byte tokens) or %d (4-byte tokens): not an "
                        "llm.c token shard",
                        (long long)magic, DATA_SHARD_MAGIC, DATA_SHARD_MAGIC_U32);
    const bool wide = magic == DATA_SHARD_MAGIC_U32;
    const int want_version = wide ? DATA_SHARD_VERSION_U32 : DATA_SHARD_VERSION;
    int64_t version = get_le32_signed(head + 4);
    if (version != want_version)
        return data_err(err, "unsupported version %lld, want %d for magic %lld", (long long)version,
                        want_version, (long long)magic);
    int64_t n = get_le32_signed(head + 8);
    if (n < 0)
        return data_err(err, "negative token count %lld in the header", (long long)n);
    const int w = wide ? 4 : 2;
    int64_t want = HEADER_BYTES + w * n;
    if (file_size != want)
        return data_err(err,
                        "the header's %lld tokens of %d bytes need %lld bytes but the file has "
                        "%lld (%s)",
                        (long long)n, w, (long long)want, (long long)file_size,
                        file_size < want ? "count larger than the file: truncated?"
                                         : "count smaller than the file");
    *ntok = n;
    if (token_bytes)
        *token_bytes = w;
    return 0;
}

int data_shard_check_header(const uint8_t *head, size_t head_len, int64_t file_size, int64_t *ntok,
                            bmt_error_t *err)
{
    return data_shard_header(head, head_len, file_size, ntok, NULL, err);
}

void data_shard_make_header_w(uint8_t out[DATA_SHARD_HEADER_BYTES], int64_t n, int token_bytes)
{
    memset(out, 0, HEADER_BYTES);
    put_le32(out, token_bytes == 4 ? DATA_SHARD_MAGIC_U32 : DATA_SHARD_MAGIC);
    put_le32(out + 4, token_bytes == 4 ? DATA_SHARD_VERSION_U32 : DATA_SHARD_VERSION);
    put_le32(out + 8, (uint32_t)n);
}

void data_shard_make_header(uint8_t out[DATA_SHARD_HEADER_BYTES], int64_t n)
{
    data_shard_make_header_w(out, n, 2);
}

/* ---------------------------------------------------------------- raw I/O */

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Bytes read (fewer than len only at end of file), or -1 with errno. */
static ssize_t pread_full(int fd, void *buf, size_t len, off_t off)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, p + got, len - got, off + (off_t)got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* ---------------------------------------------------------------- atomic shard writer */

/* One output shard on its way to its final name. The header announces `want`
 * tokens up front; out_finish checks that exactly that many were written. */
typedef struct shard_out {
    const char *path; /* final name (borrowed) */
    char *tmp;        /* temporary name beside it; NULL when there is none */
    int fd;           /* open temporary file, or -1 */
    int64_t want;     /* tokens announced in the header */
    int64_t have;     /* tokens written so far */
    int width;        /* bytes per token: 2 or 4 */
} shard_out_t;

static atomic_uint tmp_counter;

static void out_abort(shard_out_t *o)
{
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
    if (o->tmp) {
        unlink(o->tmp);
        free(o->tmp);
        o->tmp = NULL;
    }
}

/* DIR/.NAME.tmp.PID.N beside path, a new N each call, into out[len] (len at
 * least strlen(path) + TMP_NAME_EXTRA): a writer killed between its last
 * write and the rename leaves a whole shard under this name, which a pattern
 * matching every file of DIR must not train on a second time. A leading dot
 * keeps it out of glob's matches; data_loader_open refuses one a pattern
 * names anyway. */
#define TMP_NAME_EXTRA 48
static void tmp_name(char *out, size_t len, const char *path)
{
    const char *slash = strrchr(path, '/');
    const int dirlen = slash ? (int)(slash - path + 1) : 0;
    snprintf(out, len, "%.*s.%s.tmp.%ld.%u", dirlen, path, path + dirlen, (long)getpid(),
             atomic_fetch_add(&tmp_counter, 1u));
}

static int out_begin(shard_out_t *o, const char *path, int64_t n, int width, bmt_error_t *err)
{
    *o = (shard_out_t){ path, NULL, -1, n, 0, width };
    size_t len = strlen(path) + TMP_NAME_EXTRA;
    o->tmp = malloc(len);
    if (o->tmp == NULL)
        return data_err(err, "%s: out of memory", shown(path).s);
    /* O_EXCL rather than mkstemp: the file gets the usual 0666 & ~umask mode. */
    for (int tries = 0;; tries++) {
        tmp_name(o->tmp, len, path);
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (o->fd >= 0)
            break;
        if (errno != EEXIST || tries >= 100) {
            int e = errno;
            free(o->tmp);
            o->tmp = NULL;
            return data_err(err, "%s: cannot create a temporary file beside it: %s", shown(path).s,
                            strerror(e));
        }
    }
    uint8_t head[HEADER_BYTES];
    data_shard_make_header_w(head, n, width);
    if (write_all(o->fd, head, sizeof(head)) != 0) {
        int e = errno;
        out_abort(o);
        return data_err(err, "%s: writing the header: %s", shown(path).s, strerror(e));
    }
    return 0;
}

/* Append tokens given as little-endian bytes (nbytes a multiple of the width). */
static int out_write(shard_out_t *o, const uint8_t *le, size_t nbytes, bmt_error_t *err)
{
    if (write_all(o->fd, le, nbytes) != 0) {
        int e = errno;
        out_abort(o);
        return data_err(err, "%s: writing tokens: %s", shown(o->path).s, strerror(e));
    }
    o->have += (int64_t)(nbytes / (size_t)o->width);
    return 0;
}

/* Make the temporary file durable; it still has its temporary name. */
static int out_finish(shard_out_t *o, bmt_error_t *err)
{
    if (o->have != o->want) {
        long long have = o->have, want = o->want;
        out_abort(o);
        return data_err(err, "%s: wrote %lld tokens, the header says %lld", shown(o->path).s, have,
                        want);
    }
    int e = 0;
    if (fsync(o->fd) != 0)
        e = errno;
    if (close(o->fd) != 0 && e == 0) /* NFS reports write errors at close */
        e = errno;
    o->fd = -1;
    if (e) {
        out_abort(o);
        return data_err(err, "%s: fsync/close: %s", shown(o->path).s, strerror(e));
    }
    return 0;
}

/* Rename into place, then fsync the directory so the new name survives a crash.
 * The directory fsync is best effort: the file is already complete and in place,
 * and some file systems refuse fsync on directories. */
static int out_commit(shard_out_t *o, bmt_error_t *err)
{
    if (rename(o->tmp, o->path) != 0) {
        int e = errno;
        out_abort(o);
        return data_err(err, "%s: rename into place: %s", shown(o->path).s, strerror(e));
    }
    free(o->tmp);
    o->tmp = NULL;
    char *dir = strdup(o->path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        const char *d = slash == NULL ? "." : slash == dir ? "/" : (*slash = '\0', dir);
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return 0;
}

#define CHUNK_TOKENS 16384

/* Write n tokens of `width` bytes (tokens16 or tokens32) as one shard. */
static int write_shard(const char *path, const uint16_t *tokens16, const uint32_t *tokens32,
                       size_t n, bmt_error_t *err)
{
    const int width = tokens32 ? 4 : 2;
    if (path == NULL || *path == '\0')
        return data_err(err, "data_write_shard: no path given");
    if (n > (size_t)DATA_SHARD_MAX_TOKENS)
        return data_err(err, "%s: %zu tokens do not fit one shard (at most %lld)", shown(path).s, n,
                        DATA_SHARD_MAX_TOKENS);
    if (n > 0 && tokens16 == NULL && tokens32 == NULL)
        return data_err(err, "%s: %zu tokens to write but tokens is NULL", shown(path).s, n);
    shard_out_t o;
    if (out_begin(&o, path, (int64_t)n, width, err) != 0)
        return -1;
    uint8_t le[4 * CHUNK_TOKENS];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CHUNK_TOKENS ? n - done : CHUNK_TOKENS;
        for (size_t i = 0; i < k; i++) {
            uint32_t t = tokens32 ? tokens32[done + i] : tokens16[done + i];
            for (int b = 0; b < width; b++)
                le[(size_t)width * i + (size_t)b] = (uint8_t)(t >> (8 * b));
        }
        if (out_write(&o, le, (size_t)width * k, err) != 0)
            return -1;
        done += k;
    }
    if (out_finish(&o, err) != 0 || out_commit(&o, err) != 0)
        return -1;
    return 0;
}

int data_write_shard(const char *path, const uint16_t *tokens, size_t n, bmt_error_t *err)
{
    if (n > 0 && tokens == NULL && path && *path)
        return data_err(err, "%s: %zu tokens to write but tokens is NULL", shown(path).s, n);
    return write_shard(path, tokens, NULL, n, err);
}

int data_write_shard_u32(const char *path, const uint32_t *tokens, size_t n, bmt_error_t *err)
{
    if (n > 0 && tokens == NULL && path && *path)
        return data_err(err, "%s: %zu tokens to write but tokens is NULL", shown(path).s, n);
    return write_shard(path, NULL, tokens, n, err);
}

/* ---------------------------------------------------------------- reader */

struct data_loader {
    int B, T, rank, world;
    int64_t bt;     /* B*T: tokens of one rank's batch */
    int64_t global; /* world*B*T: tokens of one global micro-batch */
    int accum;      /* micro-batches per global batch (data_loader_set_accum; 1) */
    int micro;      /* which micro-batch of the global batch at (shard, pos) is next */
    int nshards;
    char **paths;  /* (nshards) glob matches in glob's order, owned */
    int64_t *ntok; /* (nshards) tokens in each shard, as validated at open */
    int *width;    /* (nshards) bytes per token in each shard: 2 or 4 */
    int64_t total; /* sum of ntok */
    int shard;     /* position of the current global batch: shard index ... */
    int64_t pos;   /* ... and token offset in it (identical on every rank) */
    int fd;        /* the one open shard file, or -1 */
    int fd_shard;  /* which shard fd is, or -1 */
    uint8_t *buf;  /* (B*T+1) tokens of up to 4 bytes: this rank's slice as read */
};

/* Open a shard and validate its header against its real size. Returns the open
 * file descriptor, the token count and width, or -1 with err naming the file. */
static int shard_open(const char *path, int64_t *ntok, int *width, bmt_error_t *err)
{
    /* O_NONBLOCK: a FIFO must not block the open; fstat refuses it below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return data_err(err, "%s: %s", shown(path).s, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return data_err(err, "%s: %s", shown(path).s, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return data_err(err, "%s: not a regular file", shown(path).s);
    }
    uint8_t head[HEADER_BYTES];
    ssize_t got = pread_full(fd, head, sizeof(head), 0);
    if (got < 0) {
        int e = errno;
        close(fd);
        return data_err(err, "%s: reading the header: %s", shown(path).s, strerror(e));
    }
    bmt_error_t why;
    if (data_shard_header(head, (size_t)got, (int64_t)st.st_size, ntok, width, &why) != 0) {
        close(fd);
        return data_err(err, "%s: %s", shown(path).s, why.text);
    }
    return fd;
}

void data_loader_destroy(data_loader_t *l)
{
    if (l == NULL)
        return;
    if (l->fd >= 0)
        close(l->fd);
    for (int i = 0; l->paths && i < l->nshards; i++)
        free(l->paths[i]);
    free(l->paths);
    free(l->ntok);
    free(l->width);
    free(l->buf);
    free(l);
}

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* Is path's name a shard writer's temporary file: NAME.tmp.PID.N (with a
 * leading dot since out_begin adds one; without, as earlier writers made)? */
static int is_writer_tmp(const char *path)
{
    const char *t = NULL;
    for (const char *p = strstr(path, ".tmp."); p; p = strstr(p + 1, ".tmp."))
        t = p;
    if (t == NULL || strchr(t, '/'))
        return 0;
    const char *s = t + 5;
    int dots = 0, digits = 0;
    for (; *s; s++) {
        if (*s == '.' && digits > 0)
            dots++, digits = 0;
        else if (*s >= '0' && *s <= '9')
            digits++;
        else
            return 0;
    }
    return dots == 1 && digits > 0;
}

/* glob(3) skips a folder it cannot read, and the shards in it with it: a run
 * would train on part of its data and say nothing. Its error callback stops
 * it at the first such folder instead; the callback has no user pointer, so
 * the folder and errno wait here (per thread) for data_loader_open's message.
 * A folder that is not there (or not a folder) only matches nothing, as in a
 * shell. */
static _Thread_local struct {
    int err;
    char path[SHOWN_MAX + 1];
} glob_failed;

static int glob_error(const char *path, int e)
{
    if (e == ENOENT || e == ENOTDIR)
        return 0;
    glob_failed.err = e;
    snprintf(glob_failed.path, sizeof(glob_failed.path), "%s", shown(path).s);
    return 1;
}

data_loader_t *data_loader_open(const char *pattern, int B, int T, int rank, int world,
                                bmt_error_t *err)
{
    if (pattern == NULL || *pattern == '\0') {
        data_err(err, "data_loader_open: no shard path or pattern given");
        return NULL;
    }
    if (B < 1 || T < 1 || world < 1 || rank < 0 || rank >= world) {
        data_err(err,
                 "data_loader_open(%s): need B, T, world >= 1 and 0 <= rank < world, got "
                 "B=%d T=%d rank=%d world=%d",
                 shown(pattern).s, B, T, rank, world);
        return NULL;
    }
    int64_t bt = (int64_t)B * T;
    if (bt >= DATA_SHARD_MAX_TOKENS) {
        data_err(err, "data_loader_open(%s): B*T = %lld tokens, more than a shard can hold",
                 shown(pattern).s, (long long)bt);
        return NULL;
    }
    int64_t global = bt * world; /* < 2^31 * 2^31: no overflow */

    glob_t g;
    glob_failed.err = 0;
    int rc = glob(pattern, 0, glob_error, &g);
    if (rc != 0) {
        if (rc == GLOB_ABORTED && glob_failed.err) {
            data_err(err,
                     "%s: cannot list the folder %s: %s; its shards would be left out (make it "
                     "readable, or give a pattern that does not reach into it)",
                     shown(pattern).s, glob_failed.path, strerror(glob_failed.err));
        } else if (rc == GLOB_NOMATCH && !has_glob_chars(pattern)) {
            struct stat st;
            data_err(err, "%s: %s", shown(pattern).s,
                     stat(pattern, &st) != 0 ? strerror(errno) : "cannot be listed");
        } else if (rc == GLOB_NOMATCH) {
            data_err(err, "no shard file matches %s", shown(pattern).s);
        } else {
            data_err(err, "%s: glob failed (%s)", shown(pattern).s,
                     rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
        }
        if (rc != GLOB_NOMATCH)
            globfree(&g);
        return NULL;
    }
    if (g.gl_pathc > INT_MAX) {
        data_err(err, "%s: %zu shards, too many", shown(pattern).s, g.gl_pathc);
        globfree(&g);
        return NULL;
    }

    data_loader_t *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        globfree(&g);
        data_err(err, "data_loader_open(%s): out of memory", shown(pattern).s);
        return NULL;
    }
    *l = (data_loader_t){ .B = B,
                          .T = T,
                          .rank = rank,
                          .world = world,
                          .bt = bt,
                          .global = global,
                          .accum = 1,
                          .fd = -1,
                          .fd_shard = -1 };
    l->paths = calloc(g.gl_pathc, sizeof(*l->paths));
    l->ntok = calloc(g.gl_pathc, sizeof(*l->ntok));
    l->width = calloc(g.gl_pathc, sizeof(*l->width));
    l->buf = malloc((size_t)(bt + 1) * 4);
    if (l->paths == NULL || l->ntok == NULL || l->width == NULL || l->buf == NULL) {
        data_err(err, "data_loader_open(%s): out of memory", shown(pattern).s);
        goto fail;
    }
    /* Validate every shard now, as llm.c does, so a bad file fails at start-up
     * and not hours into a run. */
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *path = g.gl_pathv[i];
        if (is_writer_tmp(path)) {
            data_err(err,
                     "%s: a shard writer's temporary file (NAME.tmp.PID.N), left by a writer "
                     "that did not finish; its tokens may be a shard's a second time. Remove it, "
                     "or give a pattern that does not match it",
                     shown(path).s);
            goto fail;
        }
        int64_t n = 0;
        int w = 2;
        int fd = shard_open(path, &n, &w, err);
        if (fd < 0)
            goto fail;
        close(fd);
        if (n < global + 1) {
            data_err(err,
                     "%s: %lld tokens, fewer than one global batch needs: world*B*T+1 = "
                     "%d*%d*%d+1 = %lld",
                     shown(path).s, (long long)n, world, B, T, (long long)(global + 1));
            goto fail;
        }
        l->paths[i] = strdup(path);
        if (l->paths[i] == NULL) {
            data_err(err, "data_loader_open(%s): out of memory", shown(pattern).s);
            goto fail;
        }
        l->nshards = (int)i + 1;
        l->ntok[i] = n;
        l->width[i] = w;
        l->total += n;
    }
    globfree(&g);
    return l;
fail:
    data_loader_destroy(l); /* frees paths[0..nshards) */
    globfree(&g);
    return NULL;
}

/* Open shard s again, re-checking its header: a shard replaced since
 * data_loader_open would otherwise be read at offsets computed for the old
 * one. The file descriptor, or -1 and err. */
static int shard_reopen(const data_loader_t *l, int s, bmt_error_t *err)
{
    int64_t n = 0;
    int w = 2;
    int fd = shard_open(l->paths[s], &n, &w, err);
    if (fd < 0)
        return -1;
    if (n != l->ntok[s] || w != l->width[s]) {
        close(fd);
        return data_err(err,
                        "%s: now holds %lld tokens of %d bytes, %lld of %d when the loader "
                        "opened it",
                        shown(l->paths[s]).s, (long long)n, w, (long long)l->ntok[s], l->width[s]);
    }
    return fd;
}

/* Make fd the open file of shard s (shard_reopen). */
static int ensure_open(data_loader_t *l, int s, bmt_error_t *err)
{
    if (l->fd_shard == s)
        return 0;
    int fd = shard_reopen(l, s, err);
    if (fd < 0)
        return -1;
    if (l->fd >= 0)
        close(l->fd);
    l->fd = fd;
    l->fd_shard = s;
    return 0;
}

int data_loader_next(data_loader_t *l, int32_t *inputs, int32_t *targets, bmt_error_t *err)
{
    if (l == NULL || inputs == NULL || targets == NULL)
        return data_err(err, "data_loader_next: loader, inputs and targets are required");
    int s = l->shard;
    int64_t p = l->pos;
    /* llm.c: current_sample_idx >= shard_num_samples = (n - 1) / G advances to
     * the next shard, and after the last one resets to the first. Decided for
     * the whole global batch at its first micro-batch, so that its micro-batches
     * never straddle two shards and every split of one global batch into
     * ranks and micro-batches reads the same tokens. */
    if (l->micro == 0 && p + l->global * l->accum + 1 > l->ntok[s]) {
        s = (s + 1) % l->nshards;
        p = 0;
    }
    if (ensure_open(l, s, err) != 0)
        return -1;
    int64_t first = p + l->micro * l->global + (int64_t)l->rank * l->bt;
    const int w = l->width[s];
    size_t len = (size_t)(l->bt + 1) * (size_t)w;
    off_t off = (off_t)(HEADER_BYTES + w * first);
    ssize_t got = pread_full(l->fd, l->buf, len, off);
    if (got < 0)
        return data_err(err, "%s: reading %zu bytes at %lld: %s", shown(l->paths[s]).s, len,
                        (long long)off, strerror(errno));
    if ((size_t)got < len)
        return data_err(err, "%s: ends at byte %lld, before the batch at %lld..%lld (truncated?)",
                        shown(l->paths[s]).s, (long long)(off + got), (long long)off,
                        (long long)(off + (off_t)len));
    const uint8_t *b = l->buf;
    if (w == 4) {
        /* Check every token first: the outputs stay untouched on failure. */
        for (int64_t i = 0; i <= l->bt; i++)
            if (b[4 * i + 3] & 0x80)
                return data_err(err,
                                "%s: token %lld of the shard is %lu, past the int32 ids a batch "
                                "holds",
                                shown(l->paths[s]).s, (long long)(first + i),
                                (unsigned long)get_le32(b + 4 * i));
        for (int64_t i = 0; i < l->bt; i++) {
            inputs[i] = (int32_t)get_le32(b + 4 * i);
            targets[i] = (int32_t)get_le32(b + 4 * i + 4);
        }
    } else {
        for (int64_t i = 0; i < l->bt; i++) {
            inputs[i] = (int32_t)(b[2 * i] | b[2 * i + 1] << 8);
            targets[i] = (int32_t)(b[2 * i + 2] | b[2 * i + 3] << 8);
        }
    }
    l->shard = s;
    l->pos = p;
    if (++l->micro == l->accum) {
        l->micro = 0;
        l->pos = p + l->global * l->accum;
    }
    return 0;
}

int data_loader_set_accum(data_loader_t *l, int accum, bmt_error_t *err)
{
    if (l == NULL)
        return data_err(err, "data_loader_set_accum: loader is NULL");
    if (accum < 1)
        return data_err(err, "data_loader_set_accum: need accum >= 1, got %d", accum);
    /* no shard holds more than DATA_SHARD_MAX_TOKENS: a larger batch fits none */
    const int64_t step =
        l->global > DATA_SHARD_MAX_TOKENS / accum ? DATA_SHARD_MAX_TOKENS : l->global * accum;
    for (int s = 0; s < l->nshards; s++)
        if (l->ntok[s] < step + 1)
            return data_err(err,
                            "%s: %lld tokens, fewer than one global batch needs: "
                            "accum*world*B*T+1 = %d*%d*%d*%d+1 = %lld",
                            shown(l->paths[s]).s, (long long)l->ntok[s], accum, l->world, l->B,
                            l->T, (long long)(step + 1));
    l->accum = accum;
    l->micro = 0;
    return 0;
}

void data_loader_reset(data_loader_t *l)
{
    if (l == NULL)
        return;
    l->shard = 0;
    l->pos = 0;
    l->micro = 0;
}

void data_loader_position(const data_loader_t *l, int *shard, int64_t *pos)
{
    if (shard)
        *shard = l ? l->shard : 0;
    if (pos)
        *pos = l ? l->pos : 0;
}

int data_loader_seek(data_loader_t *l, int shard, int64_t pos, bmt_error_t *err)
{
    if (l == NULL)
        return data_err(err, "data_loader_seek: loader is NULL");
    if (shard < 0 || shard >= l->nshards)
        return data_err(err, "data_loader_seek: shard %d out of range: there are %d shards", shard,
                        l->nshards);
    if (pos < 0 || pos > l->ntok[shard])
        return data_err(err, "data_loader_seek: position %lld outside %s, which has %lld tokens",
                        (long long)pos, shown(l->paths[shard]).s, (long long)l->ntok[shard]);
    l->shard = shard;
    l->pos = pos;
    l->micro = 0;
    return 0;
}

int64_t data_loader_tokens(const data_loader_t *l) { return l ? l->total : 0; }

int64_t data_loader_batches(const data_loader_t *l)
{
    int64_t n = 0;
    for (int s = 0; l && s < l->nshards; s++) /* data_loader_next's rule: G + 1 tokens left */
        n += (l->ntok[s] - 1) / (l->global * l->accum);
    return n;
}

int data_loader_token_bytes(const data_loader_t *l, int i)
{
    return l && i >= 0 && i < l->nshards ? l->width[i] : -1;
}

int data_loader_num_shards(const data_loader_t *l) { return l ? l->nshards : 0; }

int64_t data_loader_shard_tokens(const data_loader_t *l, int i)
{
    return l && i >= 0 && i < l->nshards ? l->ntok[i] : -1;
}

const char *data_loader_shard_path(const data_loader_t *l, int i)
{
    return l && i >= 0 && i < l->nshards ? l->paths[i] : NULL;
}

uint64_t data_loader_digest(const data_loader_t *l)
{
    if (l == NULL)
        return 0;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (int s = 0; s < l->nshards; s++) {
        const char *slash = strrchr(l->paths[s], '/');
        const char *name = slash ? slash + 1 : l->paths[s];
        uint8_t le[9];
        for (int b = 0; b < 8; b++)
            le[b] = (uint8_t)((uint64_t)l->ntok[s] >> (8 * b));
        le[8] = (uint8_t)l->width[s];
        XXH3_64bits_update(&st, name, strlen(name) + 1); /* the NUL ends the name */
        XXH3_64bits_update(&st, le, sizeof(le));
    }
    return (uint64_t)XXH3_64bits_digest(&st);
}

int data_loader_shard_hash(const data_loader_t *l, int i, int64_t from, int64_t to, uint64_t *hash,
                           bmt_error_t *err)
{
    if (l == NULL || hash == NULL)
        return data_err(err, "data_loader_shard_hash: loader and hash are required");
    if (i < 0 || i >= l->nshards)
        return data_err(err, "data_loader_shard_hash: shard %d out of range: there are %d shards",
                        i, l->nshards);
    if (from < 0 || from > to || to > l->ntok[i])
        return data_err(err, "data_loader_shard_hash: tokens %lld..%lld outside %s, which has %lld",
                        (long long)from, (long long)to, shown(l->paths[i]).s,
                        (long long)l->ntok[i]);
    const int fd = shard_reopen(l, i, err), w = l->width[i];
    if (fd < 0)
        return -1;
    int rc = 0;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    enum {
        CHUNK = 1 << 20
    };
    uint8_t *buf = malloc(CHUNK);
    if (buf == NULL)
        rc = data_err(err, "out of memory");
    const off_t end = (off_t)(HEADER_BYTES + (int64_t)w * to);
    for (off_t off = (off_t)(HEADER_BYTES + (int64_t)w * from); rc == 0 && off < end;) {
        size_t len = end - off < CHUNK ? (size_t)(end - off) : CHUNK;
        ssize_t got = pread_full(fd, buf, len, off);
        if (got < 0)
            rc = data_err(err, "%s: reading %zu bytes at %lld: %s", shown(l->paths[i]).s, len,
                          (long long)off, strerror(errno));
        else if ((size_t)got < len)
            rc = data_err(err, "%s: ends at byte %lld, inside tokens %lld..%lld (truncated?)",
                          shown(l->paths[i]).s, (long long)(off + got), (long long)from,
                          (long long)to);
        else
            XXH3_64bits_update(&st, buf, len), off += (off_t)len;
    }
    free(buf);
    close(fd);
    if (rc == 0)
        *hash = (uint64_t)XXH3_64bits_digest(&st);
    return rc;
}

/* ---------------------------------------------------------------- byte-level tokenizer */

/* Copy text bytes [off, off+len) of fd into o as tokens (token = byte). */
static int copy_bytes(int fd, const char *text_path, int64_t off, int64_t len, shard_out_t *o,
                      bmt_error_t *err)
{
    uint8_t in[CHUNK_TOKENS], le[2 * CHUNK_TOKENS];
    for (int64_t done = 0; done < len;) {
        size_t k = len - done < CHUNK_TOKENS ? (size_t)(len - done) : CHUNK_TOKENS;
        ssize_t got = pread_full(fd, in, k, (off_t)(off + done));
        if (got < 0 || (size_t)got < k) {
            int e = errno;
            out_abort(o);
            return data_err(err, "%s: %s", shown(text_path).s,
                            got < 0 ? strerror(e) : "the file shrank while it was read");
        }
        for (size_t i = 0; i < k; i++) {
            le[2 * i] = in[i];
            le[2 * i + 1] = 0;
        }
        if (out_write(o, le, 2 * k, err) != 0)
            return -1;
        done += (int64_t)k;
    }
    return 0;
}

/* The folders of path that do not exist yet, made (mode 0777 & ~umask),
 * outermost first; their paths in *made (malloc'ed, *nmade of them) so that a
 * failure later can take them away again (unmake). -1 with err when one
 * cannot be made (those made before it are taken away). */
#define MAX_MADE 64
static void unmake(char **made, int n)
{
    while (n > 0) {
        rmdir(made[--n]);
        free(made[n]);
    }
}

static int make_parents(const char *path, char **made, int *nmade, bmt_error_t *err)
{
    *nmade = 0;
    char *dir = strdup(path);
    if (dir == NULL)
        return data_err(err, "%s: out of memory", shown(path).s);
    char *slash = strrchr(dir, '/');
    if (slash == NULL || slash == dir) { /* in the working directory, or in / */
        free(dir);
        return 0;
    }
    *slash = '\0';
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        const char c = *p;
        *p = '\0';
        struct stat st;
        if (stat(dir, &st) != 0) {
            bool mine = false;
            if (errno != ENOENT || *nmade == MAX_MADE || !(mine = mkdir(dir, 0777) == 0) ||
                (made[*nmade] = strdup(dir)) == NULL) {
                int e = *nmade == MAX_MADE ? ENAMETOOLONG : errno;
                if (mine) /* made, but its name could not be kept: take it away now */
                    rmdir(dir);
                data_err(err, "%s: cannot make its folder %s: %s", shown(path).s, shown(dir).s,
                         strerror(e));
                unmake(made, *nmade);
                *nmade = 0;
                free(dir);
                return -1;
            }
            (*nmade)++;
        } else if (!S_ISDIR(st.st_mode)) {
            data_err(err, "%s: %s is not a folder", shown(path).s, shown(dir).s);
            unmake(made, *nmade);
            *nmade = 0;
            free(dir);
            return -1;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    free(dir);
    return 0;
}

/* The file at path now (an earlier shard that a rename is about to replace),
 * kept under a second name beside it (a hard link, named as tmp_name names),
 * so that it can be put back if the rest of the publishing fails. 0 and *kept
 * (malloc'ed; NULL when there is no such file, or it is a folder, which the
 * rename refuses anyway), or -1 and err when it cannot be kept (a file
 * system without hard links): then nothing has changed. */
static int keep_earlier(const char *path, char **kept, bmt_error_t *err)
{
    *kept = NULL;
    struct stat st;
    if (lstat(path, &st) != 0 || S_ISDIR(st.st_mode))
        return 0;
    size_t len = strlen(path) + TMP_NAME_EXTRA;
    char *k = malloc(len);
    if (k == NULL)
        return data_err(err, "%s: out of memory", shown(path).s);
    for (int tries = 0;; tries++) {
        tmp_name(k, len, path);
        if (link(path, k) == 0)
            break;
        if (errno == ENOENT) { /* gone meanwhile: nothing to keep */
            free(k);
            return 0;
        }
        if (errno != EEXIST || tries >= 100) {
            int e = errno;
            free(k);
            return data_err(err,
                            "%s: cannot keep the earlier file to put it back should the writing "
                            "fail (link: %s); remove it first, or write elsewhere",
                            shown(path).s, strerror(e));
        }
    }
    *kept = k;
    return 0;
}

int data_tokenize_file(const char *text_path, const char *out_prefix, double val_fraction,
                       bmt_error_t *err)
{
    if (text_path == NULL || out_prefix == NULL || *out_prefix == '\0')
        return data_err(err, "data_tokenize_file: a text path and an output prefix are required");
    if (!(val_fraction >= 0.0 && val_fraction < 1.0)) /* also refuses NaN */
        return data_err(err, "data_tokenize_file(%s): val_fraction must be in [0, 1), got %g",
                        shown(text_path).s, val_fraction);
    /* O_NONBLOCK: a FIFO must not block the open; fstat refuses it below */
    int fd = open(text_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return data_err(err, "%s: %s", shown(text_path).s, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return data_err(err, "%s: %s", shown(text_path).s, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return data_err(err, "%s: not a regular file", shown(text_path).s);
    }
    int64_t n = (int64_t)st.st_size;
    if (n > DATA_SHARD_MAX_TOKENS) {
        close(fd);
        return data_err(err, "%s: %lld bytes, more tokens than one shard holds (%lld)",
                        shown(text_path).s, (long long)n, DATA_SHARD_MAX_TOKENS);
    }
    int64_t n_val = (int64_t)(val_fraction * (double)n); /* floor: both are >= 0 */
    int64_t n_train = n - n_val;
    if (n_train < 1) {
        close(fd);
        return data_err(err, "%s: %lld bytes leave nothing for the train part", shown(text_path).s,
                        (long long)n);
    }
    size_t plen = strlen(out_prefix) + sizeof("_train.bin");
    char *train_path = malloc(plen), *val_path = malloc(plen);
    if (train_path == NULL || val_path == NULL) {
        free(train_path);
        free(val_path);
        close(fd);
        return data_err(err, "data_tokenize_file(%s): out of memory", shown(text_path).s);
    }
    snprintf(train_path, plen, "%s_train.bin", out_prefix);
    snprintf(val_path, plen, "%s_val.bin", out_prefix);

    int rc = -1, nmade = 0;
    char *made[MAX_MADE], *kept = NULL;
    shard_out_t train, val;
    if (make_parents(train_path, made, &nmade, err) != 0 ||
        out_begin(&train, train_path, n_train, 2, err) != 0)
        goto out;
    if (copy_bytes(fd, text_path, 0, n_train, &train, err) != 0 || out_finish(&train, err) != 0)
        goto out;
    if (out_begin(&val, val_path, n_val, 2, err) != 0) {
        out_abort(&train);
        goto out;
    }
    if (copy_bytes(fd, text_path, n_train, n_val, &val, err) != 0 || out_finish(&val, err) != 0) {
        out_abort(&train);
        goto out;
    }
    /* Both complete: now publish them, the pair whole or not at all. The
     * train shard's rename replaces an earlier one (--prepare run again),
     * which is kept until the val shard is in place too and put back if its
     * rename fails. */
    if (keep_earlier(train_path, &kept, err) != 0) {
        out_abort(&train);
        out_abort(&val);
        goto out;
    }
    if (out_commit(&train, err) != 0) {
        out_abort(&val);
        goto out;
    }
    if (out_commit(&val, err) != 0) {
        if (kept == NULL || rename(kept, train_path) != 0)
            unlink(train_path);
        else
            free(kept), kept = NULL; /* back under its name: nothing to remove */
        goto out;
    }
    rc = 0;
out:
    if (kept) {
        unlink(kept);
        free(kept);
    }
    if (rc != 0)
        unmake(made, nmade); /* nothing new is left behind, folders included */
    else
        while (nmade > 0)
            free(made[--nmade]);
    close(fd);
    free(train_path);
    free(val_path);
    return rc;
}

/* Length (2..4) of the well-formed UTF-8 sequence at t[0..n), or 0 (RFC 3629
 * table 3-7: no overlong forms, no surrogates, nothing past U+10FFFF). */
static int utf8_len(const int32_t *t, int n)
{
    int32_t b0 = t[0];
    int len, lo = 0x80, hi = 0xbf;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        len = 2;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
        len = 3;
        lo = b0 == 0xe0 ? 0xa0 : 0x80;
        hi = b0 == 0xed ? 0x9f : 0xbf;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
        len = 4;
        lo = b0 == 0xf0 ? 0x90 : 0x80;
        hi = b0 == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (int k = 1; k < len; k++) {
        int32_t b = t[k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf))
            return 0;
    }
    return len;
}

int data_decode_bytes(const int32_t *tokens, int n, char *out, size_t outlen)
{
    if (n < 0 || (tokens == NULL && n > 0) || (out == NULL && outlen > 0))
        return -1;
    size_t total = 0, written = 0;
    int cut = 0;
    for (int i = 0; i < n;) {
        char piece[24];
        size_t plen;
        int adv = 1;
        int32_t t = tokens[i];
        if (t < 0 || t >= DATA_BYTE_VOCAB) {
            plen = (size_t)snprintf(piece, sizeof(piece), "<|%ld|>", (long)t);
        } else if ((t >= 0x20 && t <= 0x7e) || t == '\n' || t == '\t') {
            piece[0] = (char)t;
            plen = 1;
        } else if ((adv = utf8_len(tokens + i, n - i)) > 0) {
            for (int k = 0; k < adv; k++)
                piece[k] = (char)(uint8_t)tokens[i + k];
            plen = (size_t)adv;
        } else {
            adv = 1;
            plen = (size_t)snprintf(piece, sizeof(piece), "\\x%02x", (unsigned)t);
        }
        /* Stop writing at the first piece that does not fit whole; keep counting. */
        if (!cut && outlen > 0 && written + plen < outlen) {
            memcpy(out + written, piece, plen);
            written += plen;
        } else {
            cut = 1;
        }
        total += plen;
        i += adv;
    }
    if (outlen > 0)
        out[written] = '\0';
    return total > (size_t)INT_MAX ? -1 : (int)total;
}
