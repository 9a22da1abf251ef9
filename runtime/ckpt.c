/* runtime/ckpt.c — checkpoints (bmt/ckpt.h).
 *
 * Each block's files have a layout every rank computes alike from the block
 * (struct flayout): tensors in parameter order, back to back after the JSON
 * header (padded with spaces to 8 bytes, as the safetensors writer does). A
 * rank of group 0 then knows, for each piece of a parameter in its shard,
 * where in which file it goes: data_start + tensor offset + first element x
 * itemsize. Padding and alignment gaps of the flat buffers are never written.
 *
 * Agreement: every phase that can fail on one rank ends in a world all-reduce
 * of a failure flag (through a device double, as the nccl backend needs), so
 * all ranks return the same status and none waits for a peer that gave up.
 * The lowest failing rank's message then travels to every rank (a second
 * all-reduce, of its bytes), so whichever rank the launcher hears from first
 * says the real cause ("No space left on device"), not "another rank failed".
 *
 * Trust (docs/checkpoints.md): a save stages every value it writes and refuses
 * a non-finite one, naming the tensor, before anything is committed; each
 * writer records XXH3-64 of every byte range it writes, cut at multiples of
 * CK_UNIT (checksum.h), in its own checksums-<group rank>.json, and rank 0
 * records the hash of each file's header in train_state.json. A load attaches
 * those sums to the files it opens, so every byte it reads is checked
 * (bmt_st_set_checksums), and refuses non-finite values, extra blocks and
 * extra tensors. bmt_ckpt_verify checks a whole directory without a job.
 *
 * Layer: above the optimizer (runtime/optim.c) and the block list; nothing
 * below calls into this file.
 */
#include "bmt/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block.h"
#include "bmt/monitor.h"
#include "bmt/safetensors.h"
#include "checksum.h"
#include "comm.h"
#include "ctx.h"
#include "error.h"
#include "fault.h"
#include "kernels.h"

#define TRAIN_STATE_VERSION 2 /* 2: checksums and the finite check; 1 had neither */
#define SUMS_FORMAT "bmt-checksums"

enum {
    T_PARAM,
    T_EXP_AVG,
    T_EXP_AVG_SQ,
    T_MASTER
};
static const char *const suffix[] = { "", ".exp_avg", ".exp_avg_sq", ".master" };

struct ftensor {
    char *name;
    int param, kind;   /* parameter index, T_* */
    bmt_dtype_t dtype; /* in the file */
    uint64_t off;      /* bytes, from the start of the data section */
};

struct flayout {
    struct ftensor *t;
    int n;
    char *header; /* the JSON header, padded to 8 bytes */
    size_t header_len;
    uint64_t data_len;
};

static const char *st_dtype(bmt_dtype_t t)
{
    return t == BMT_F32 ? "F32" : t == BMT_BF16 ? "BF16" : t == BMT_F64 ? "F64" : "?";
}

static void flayout_free(struct flayout *f)
{
    for (int i = 0; i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    free(f->header);
    memset(f, 0, sizeof(*f));
}

/* The model file (optim false) or the optimizer file of block b. */
static int flayout_make(const bmt_block_t *b, bool optim, struct flayout *f, bmt_error_t *err)
{
    memset(f, 0, sizeof(*f));
    f->t = calloc((size_t)(3 * b->nparams + 1), sizeof(*f->t));
    json_t *h = json_object();
    if (f->t == NULL || h == NULL) {
        json_decref(h);
        return errprintf(err, "out of memory");
    }
    json_object_set_new(h, "__metadata__", json_pack("{ss}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < b->nparams; i++) {
        const struct param *p = &b->params[i];
        for (int k = optim ? T_EXP_AVG : T_PARAM; k <= (optim ? T_MASTER : T_PARAM); k++) {
            if (k == T_MASTER && p->dtype == BMT_F32)
                continue; /* an f32 parameter is its own master copy */
            struct ftensor *t = &f->t[f->n];
            size_t len = strlen(p->name) + strlen(suffix[k]) + 1;
            if ((t->name = malloc(len)) == NULL) {
                json_decref(h);
                flayout_free(f);
                return errprintf(err, "out of memory naming the tensors of block %.900s", b->name);
            }
            f->n++;
            snprintf(t->name, len, "%s%s", p->name, suffix[k]);
            t->param = i;
            t->kind = k;
            t->dtype = k == T_PARAM ? p->dtype : BMT_F32;
            t->off = off;
            uint64_t bytes = (uint64_t)p->numel * bmt_dtype_size(t->dtype);
            json_t *shape = json_array();
            for (int d = 0; d < p->ndim; d++)
                json_array_append_new(shape, json_integer(p->shape[d]));
            json_object_set_new(h, t->name,
                                json_pack("{sssos[II]}", "dtype", st_dtype(t->dtype), "shape",
                                          shape, "data_offsets", (json_int_t)off,
                                          (json_int_t)(off + bytes)));
            off += bytes;
        }
    }
    f->data_len = off;
    char *text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    if (text == NULL)
        return flayout_free(f), errprintf(err, "out of memory");
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    if ((f->header = malloc(padded)) == NULL) {
        free(text);
        flayout_free(f);
        return errprintf(err, "out of memory");
    }
    memcpy(f->header, text, n);
    memset(f->header + n, ' ', padded - n);
    f->header_len = padded;
    free(text);
    return 0;
}

/* dir/name into out (len bytes), or -1 with err when it does not fit: never
 * a path cut short. A cut one named another file: a directory of 2999 bytes
 * had its shards written beside its checkpoints (DIR//x.safetensors), and
 * the save returned 0 and committed a checkpoint without them. */
static int join(char *out, size_t len, const char *dir, const char *name, bmt_error_t *err)
{
    int n = snprintf(out, len, "%s/%s", dir, name);
    if (n >= 0 && (size_t)n < len)
        return 0;
    return errprintf(err, "%.1000s/%.1000s: the path is too long (%zu bytes; at most %zu)", dir,
                     name, strlen(dir) + 1 + strlen(name), len - 1);
}

/* Every rank learns whether any rank failed: returns 0, or -1 with err. A
 * failed rank keeps its own message; the others get the lowest failing rank's
 * ("<what> failed on rank 3: cannot write ...: No space left on device"), so
 * the cause reaches the summary whichever rank ends the job first. */
static int agree(bmt_ctx_t *ctx, int failed, const char *what, bmt_error_t *err)
{
    double v = failed ? (double)(ctx->world - ctx->rank) : 0; /* MAX: the lowest failing rank */
    bmt_error_t e2;
    if (bmt_all_reduce_host_f64(ctx->world_comm, &v, 1, BMT_MAX, &e2) < 0) {
        if (!failed && err) /* a failed rank keeps its own message */
            *err = e2;
        return -1;
    }
    if (v == 0)
        return 0;
    const int first = ctx->world - (int)v;
    double *text = calloc(BMT_ERROR_TEXT_MAX, sizeof(double));
    if (text == NULL) {
        if (!failed)
            errprintf(err, "rank %d: %s failed on rank %d (its output says why)", ctx->rank, what,
                      first);
        return -1;
    }
    if (ctx->rank == first && err)
        for (size_t i = 0; i < BMT_ERROR_TEXT_MAX - 1 && err->text[i]; i++)
            text[i] = (unsigned char)err->text[i];
    int rc = bmt_all_reduce_host_f64(ctx->world_comm, text, BMT_ERROR_TEXT_MAX, BMT_MAX, &e2);
    if (!failed) {
        char why[BMT_ERROR_TEXT_MAX];
        size_t n = 0;
        for (; rc == 0 && n < sizeof(why) - 1 && text[n] > 0; n++)
            why[n] = (char)(int)text[n];
        why[n] = '\0';
        errprintf(err, "rank %d: %s failed on rank %d: %s", ctx->rank, what, first,
                  n ? why : "(its output says why)");
    }
    free(text);
    return -1;
}

/* The list's blocks, each once (a tied block's second use skipped). */
static int unique_blocks(bmt_blocklist_t *l, bmt_block_t ***out)
{
    int n = 0, uses = bmt_blocklist_size(l);
    bmt_block_t **v = calloc((size_t)(uses ? uses : 1), sizeof(*v));
    if (v == NULL)
        return -1;
    for (int i = 0; i < uses; i++) {
        bmt_block_t *b = bmt_blocklist_block(l, i);
        if (b->index == i)
            v[n++] = b;
    }
    *out = v;
    return n;
}

/* ------------------------------------------------------------ save */

static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = pwrite(fd, c, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

/* Rank 0: create and preallocate a file of the layout, header written; *hash:
 * XXH3-64 of the 8-byte length and the header, for train_state.json. */
static int create_file(const char *path, const struct flayout *f, uint64_t *hash, bmt_error_t *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    uint64_t hl = f->header_len, total = 8 + hl + f->data_len;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(hl >> (8 * i));
    ck_stream_t *h = ck_begin();
    if (h == NULL) {
        if (fd >= 0)
            close(fd);
        return errprintf(err, "out of memory");
    }
    ck_update(h, len8, 8);
    ck_update(h, f->header, hl);
    *hash = ck_end(h);
    /* fallocate(2), not posix_fallocate: where the file system cannot
     * preallocate, glibc's fallback writes every block once more. */
    int rc = fd < 0 ? -1 : fallocate(fd, 0, 0, (off_t)total);
    if (fd >= 0 && rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL) {
        rc = -1;
    } else if (fd >= 0) {
        rc = ftruncate(fd, (off_t)total);
        if (rc == 0)
            rc = write_all(fd, len8, 8, 0) < 0 || write_all(fd, f->header, hl, 8) < 0 ? -1 : 0;
    }
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && rc == 0)
        rc = -1, e = errno;
    return rc == 0 ? 0 : errprintf(err, "cannot create %s: %s", path, strerror(e));
}

/* What a rank of group 0 writes: host copies of its shards (O(shard)) and the
 * pwrites that put each piece where every rank computes it goes. Staged on the
 * caller's thread; written by the writer thread, so training can change the
 * device shards meanwhile. */
struct wop {
    int file;        /* index into pending.paths */
    uint64_t off;    /* bytes, in the file */
    const void *src; /* into one of pending.bufs */
    size_t n;
};

struct bmt_ckpt_pending {
    bmt_ctx_t *ctx;
    bmt_optim_t *opt;
    bmt_block_t **blocks;
    int nb;
    char dir[3100], tmpdir[3300], name[256];
    char *user_json, *config_json;
    int keep;
    char **paths;
    int npaths;
    void **bufs;
    int nbufs, capbufs;
    struct wop *ops;
    int nops, capops;
    pthread_t thread;
    bool started;
    int64_t step, skipped; /* the optimizer's counters when the save began */
    bool copy;             /* stage host copies (async, or device memory); else write the shards */
    bool made_dir;         /* rank 0: this save created dir (a failed save takes it away again) */
    json_t *headers;       /* rank 0: {file: XXH3 of its header} */
    int rc;                /* the writer's: 0 or -1 with err */
    bmt_error_t err;
};

/* The temporary directories of this process's saves in progress: a sweep of
 * stale ones (left by a crash) must not take them. */
static pthread_mutex_t inflight_lock = PTHREAD_MUTEX_INITIALIZER;
static char **inflight;
static int ninflight;

static int inflight_add(const char *tmpdir)
{
    pthread_mutex_lock(&inflight_lock);
    char **v = realloc(inflight, sizeof(*v) * (size_t)(ninflight + 1));
    int rc = v ? 0 : -1;
    if (v) {
        inflight = v;
        if ((v[ninflight] = strdup(tmpdir)) == NULL)
            rc = -1;
        else
            ninflight++;
    }
    pthread_mutex_unlock(&inflight_lock);
    return rc;
}

static void inflight_remove(const char *tmpdir)
{
    pthread_mutex_lock(&inflight_lock);
    for (int i = 0; i < ninflight; i++)
        if (strcmp(inflight[i], tmpdir) == 0) {
            free(inflight[i]);
            inflight[i] = inflight[--ninflight];
            break;
        }
    if (ninflight == 0) {
        free(inflight);
        inflight = NULL;
    }
    pthread_mutex_unlock(&inflight_lock);
}

/* Is tmpdir (as spelled by a sweep) the directory of a save in flight (as
 * spelled by that save: "ck/", "./ck" and "/abs/ck" are one directory)? */
static bool is_inflight(const char *tmpdir)
{
    struct stat a, b;
    bool have = stat(tmpdir, &a) == 0;
    pthread_mutex_lock(&inflight_lock);
    bool found = false;
    for (int i = 0; i < ninflight && !found; i++)
        found = strcmp(inflight[i], tmpdir) == 0 || (have && stat(inflight[i], &b) == 0 &&
                                                     a.st_dev == b.st_dev && a.st_ino == b.st_ino);
    pthread_mutex_unlock(&inflight_lock);
    return found;
}

/* The temporary directory of a save of this process not yet finished, or
 * NULL. A save while one is pending took its directory from under its writer
 * (the same name) and could commit one save's train_state.json over the
 * other's files, checksums and all. */
static const char *inflight_any(char *out, size_t len)
{
    pthread_mutex_lock(&inflight_lock);
    const bool any = ninflight > 0;
    if (any)
        snprintf(out, len, "%s", inflight[0]);
    pthread_mutex_unlock(&inflight_lock);
    return any ? out : NULL;
}

static int remove_tree(const char *path);

static bool ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

/* Does directory path hold only what a save writes (safetensors files, its
 * JSON files, the .tmp of one being written), all regular files? A directory
 * of someone else's that happens to be called .tmp-* is left alone. */
static bool save_leftover(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return false;
    bool ours = true;
    struct dirent *e;
    char sub[4200];
    while (ours && (e = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name); /* <= 3000 + 2 names */
        ours = lstat(sub, &st) == 0 && S_ISREG(st.st_mode) &&
               (ends_with(e->d_name, ".safetensors") || ends_with(e->d_name, ".json") ||
                ends_with(e->d_name, ".json.tmp"));
    }
    closedir(d);
    return ours;
}

/* A re-saved name's old checkpoint that a crash left aside (DIR/.tmp-NAME~old,
 * see commit): put back as DIR/NAME when that is missing (the crash came
 * before the new one was renamed in, and DIR/latest may name it), else
 * removed. Rank 0 only, before a save (loads read it where it is: resolve). */
static void restore_old(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[4200], name[4200];
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, ".tmp-", 5) != 0 || n <= 9 || !ends_with(e->d_name, "~old"))
            continue;
        snprintf(path, sizeof(path), "%.3000s/%.1000s", dir, e->d_name);
        snprintf(name, sizeof(name), "%.3000s/%.*s", dir, (int)(n - 9), e->d_name + 5);
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || !save_leftover(path))
            continue;
        if (lstat(name, &st) != 0 && errno == ENOENT)
            rename(path, name);
        else
            remove_tree(path);
    }
    closedir(d);
}

/* Remove dir's .tmp-* directories that no save of this process is writing and
 * that hold only what a save writes: what crashed saves left (a crash leaves at
 * most that; see bmt/ckpt.h). Rank 0 only, at every save (after restore_old)
 * and every load from a directory (which leaves .tmp-NAME~old alone: the
 * other ranks may be reading it). */
static void sweep_stale(const char *dir, bool restore)
{
    if (restore)
        restore_old(dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[4200];
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (strncmp(e->d_name, ".tmp-", 5) != 0 || ends_with(e->d_name, "~old"))
            continue;
        snprintf(path, sizeof(path), "%.3000s/%.1000s", dir, e->d_name);
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && !is_inflight(path) &&
            save_leftover(path))
            remove_tree(path);
    }
    closedir(d);
}

static void *keep_buf(bmt_ckpt_pending_t *p, size_t bytes)
{
    if (p->nbufs == p->capbufs) {
        int cap = p->capbufs ? 2 * p->capbufs : 16;
        void **b = realloc(p->bufs, sizeof(*b) * (size_t)cap);
        if (b == NULL)
            return NULL;
        p->bufs = b, p->capbufs = cap;
    }
    void *m = malloc(bytes ? bytes : 1);
    if (m)
        p->bufs[p->nbufs++] = m;
    return m;
}

/* A group whose values live only in a master_only optimizer: its shard in its
 * dtype (the master rounded), in a host buffer the save keeps. */
static int master_values(bmt_ctx_t *ctx, bmt_ckpt_pending_t *p, const struct dgroup *d, void **out,
                         const char *block, bmt_error_t *err)
{
    const size_t bytes = dsize(d->dtype, d->shard);
    void *h = keep_buf(p, bytes);
    if (h == NULL)
        return errprintf(err, "out of memory staging block %.900s", block);
    *out = h;
    if (bmt_device(ctx) == BMT_DEVICE_CPU)
        return block_shard_values(ctx, d, h, NULL, err);
    void *tmp = bmt_alloc(ctx, BMT_MEM_WORKSPACE, bytes, err);
    int rc = tmp ? 0 : -1;
    if (rc == 0)
        rc = block_shard_values(ctx, d, tmp, NULL, err);
    if (rc == 0)
        rc = bmt_mem_download(ctx, h, tmp, bytes, err); /* waits for the cast */
    bmt_free(ctx, tmp);
    return rc;
}

/* A split master (master_only 2): the f32 master joined from the bf16 shard
 * (hi: its host copy, already staged) and the optimizer's low halves, in a
 * host buffer the save keeps. */
static int joined_master(bmt_ctx_t *ctx, bmt_ckpt_pending_t *p, const struct dgroup *d,
                         const uint16_t *hi, const uint16_t *lo, void **out, const char *block,
                         bmt_error_t *err)
{
    float *h = keep_buf(p, dsize(BMT_F32, d->shard));
    if (h == NULL)
        return errprintf(err, "out of memory staging block %.900s", block);
    *out = h;
    if (bmt_device(ctx) == BMT_DEVICE_CPU) {
        kern_join_host(hi, lo, h, d->shard);
        return 0;
    }
    uint16_t *lo_h = malloc(dsize(BMT_BF16, d->shard) + 1);
    if (lo_h == NULL)
        return errprintf(err, "out of memory staging block %.900s", block);
    int rc = bmt_mem_download(ctx, lo_h, lo, dsize(BMT_BF16, d->shard), err);
    if (rc == 0)
        kern_join_host(hi, lo_h, h, d->shard);
    free(lo_h);
    return rc;
}

static int add_op(bmt_ckpt_pending_t *p, int file, uint64_t off, const void *src, size_t n)
{
    if (p->nops == p->capops) {
        int cap = p->capops ? 2 * p->capops : 64;
        struct wop *o = realloc(p->ops, sizeof(*o) * (size_t)cap);
        if (o == NULL)
            return -1;
        p->ops = o, p->capops = cap;
    }
    p->ops[p->nops++] = (struct wop){ file, off, src, n };
    return 0;
}

/* Stage this rank's pieces of block b (both files). */
static int stage_shards(bmt_ckpt_pending_t *p, const bmt_block_t *b, bmt_error_t *err)
{
    bmt_ctx_t *ctx = p->ctx;
    bmt_optim_t *opt = p->opt;
    struct flayout fl[2] = { 0 };
    int file[2] = { -1, -1 }, rc = 0;
    for (int k = 0; k < (opt ? 2 : 1) && rc == 0; k++) {
        char name[1024], path[4200];
        block_file_name(b, k == 1, name, sizeof(name));
        if ((rc = join(path, sizeof(path), p->tmpdir, name, err)) < 0)
            break;
        char **np = realloc(p->paths, sizeof(*np) * (size_t)(p->npaths + 1));
        if (np == NULL || (np[p->npaths] = strdup(path)) == NULL) {
            if (np)
                p->paths = np;
            rc = errprintf(err, "out of memory");
            break;
        }
        p->paths = np;
        file[k] = p->npaths++;
        rc = flayout_make(b, k == 1, &fl[k], err);
    }
    for (int g = 0; g < b->ngroups && rc == 0; g++) {
        const struct dgroup *d = &b->groups[g];
        optim_view_t ov = { 0 };
        for (int i = 0; opt && i < optim_count(opt); i++) {
            optim_get(opt, i, &ov);
            if (ov.d == d)
                break;
            ov.d = NULL;
        }
        if (opt && ov.d == NULL) {
            rc = errprintf(err, "block %.900s is not this optimizer's", b->name);
            break;
        }
        /* Host copies of the shards: parameter (its dtype), then f32 state. */
        const void *src[4] = { d->param, ov.m, ov.v, ov.master };
        const size_t isz[4] = { bmt_dtype_size(d->dtype), 4, 4, 4 };
        void *stage[4] = { 0 };
        for (int k = 0; k < (opt ? 4 : 1) && rc == 0; k++) {
            if (k == T_MASTER && d->dtype == BMT_F32)
                continue;
            if (k == T_PARAM && d->param == NULL)
                rc = master_values(ctx, p, d, &stage[k], b->name, err); /* master_only */
            else if (k == T_MASTER && ov.lo != NULL) /* split: after the param's staging */
                rc = joined_master(ctx, p, d, stage[T_PARAM], ov.lo, &stage[k], b->name, err);
            else if (!p->copy)
                stage[k] = (void *)src[k]; /* cpu, synchronous: write from the shard */
            else if ((stage[k] = keep_buf(p, d->shard * isz[k])) == NULL)
                rc = errprintf(err, "out of memory staging block %.900s", b->name);
            else
                rc = bmt_mem_download(ctx, stage[k], src[k], d->shard * isz[k], err);
        }
        for (int f = 0; f < (opt ? 2 : 1) && rc == 0; f++)
            for (int t = 0; t < fl[f].n && rc == 0; t++) {
                const struct ftensor *ft = &fl[f].t[t];
                const struct param *pa = &b->params[ft->param];
                size_t lo, hi;
                if (pa->group != g || !block_in_shard(pa, d, &lo, &hi))
                    continue;
                size_t sz = isz[ft->kind];
                uint64_t at = 8 + fl[f].header_len + ft->off + (lo - pa->offset) * sz;
                const char *piece = (char *)stage[ft->kind] + (lo - d->shard_first) * sz;
                /* Never commit a non-finite value: what is checked here is
                 * exactly what the writer writes. */
                const bmt_dtype_t vt = ft->kind == T_PARAM ? d->dtype : BMT_F32;
                int64_t bad = dtype_first_nonfinite(piece, vt, hi - lo);
                if (bad >= 0) {
                    rc =
                        errprintf(err,
                                  "rank %d: tensor '%s' holds %s at element %lld: a checkpoint "
                                  "never holds a non-finite value, so nothing is saved (the "
                                  "run has diverged or its state is damaged; resume from the "
                                  "last checkpoint with a lower learning rate)",
                                  ctx->rank, ft->name, dtype_nonfinite_name(piece, vt, (size_t)bad),
                                  (long long)(lo - pa->offset) + (long long)bad);
                    break;
                }
                if (add_op(p, file[f], at, piece, (hi - lo) * sz) < 0)
                    rc = errprintf(err, "out of memory");
            }
    }
    for (int k = 0; k < 2; k++)
        flayout_free(&fl[k]);
    return rc;
}

static int write_small(const char *path, const char *text, bmt_error_t *err);

static int by_op(const void *a, const void *b)
{
    const struct wop *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Append the checksums of op o to arr: [offset, len, "xxh3 hex"] per unit,
 * units cut at multiples of CK_UNIT in the file. */
static int op_sums(const struct wop *o, json_t *arr)
{
    uint64_t at = o->off, end = o->off + o->n;
    while (at < end) {
        uint64_t cut = (at / CK_UNIT + 1) * CK_UNIT;
        uint64_t hi = cut < end ? cut : end;
        char hex[17];
        ck_hex(ck_hash((const char *)o->src + (at - o->off), (size_t)(hi - at)), hex);
        if (json_array_append_new(
                arr, json_pack("[IIs]", (json_int_t)at, (json_int_t)(hi - at), hex)) != 0)
            return -1;
        at = hi;
    }
    return 0;
}

/* The writer thread: every staged piece with pwrite, then fsync (by the writer:
 * on a shared file system the data is this node's until it does); then the
 * checksums of what it wrote, in checksums-<group rank>.json. */
static void *writer(void *arg)
{
    bmt_ckpt_pending_t *p = arg;
    qsort(p->ops, (size_t)p->nops, sizeof(*p->ops), by_op);
    json_t *files = json_object();
    if (files == NULL)
        p->rc = errprintf(&p->err, "out of memory");
    for (int f = 0; f < p->npaths && p->rc == 0; f++) {
        const char *base = strrchr(p->paths[f], '/');
        base = base ? base + 1 : p->paths[f];
        json_t *arr = json_array();
        if (arr == NULL || json_object_set_new(files, base, arr) != 0) {
            p->rc = errprintf(&p->err, "out of memory");
            break;
        }
        int fd = open(p->paths[f], O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            p->rc = errprintf(&p->err, "cannot open %s: %s", p->paths[f], strerror(errno));
            break;
        }
        for (int i = 0; i < p->nops && p->rc == 0; i++) {
            if (p->ops[i].file != f)
                continue;
            if (op_sums(&p->ops[i], arr) < 0)
                p->rc = errprintf(&p->err, "out of memory");
            else if (write_all(fd, p->ops[i].src, p->ops[i].n, p->ops[i].off) < 0)
                p->rc = errprintf(&p->err, "cannot write %s: %s", p->paths[f], strerror(errno));
            fault_point(p->ctx, FAULT_SAVE, p->step); /* BMT_FAULT=save:...: tests only */
        }
        int e = 0;
        if (fsync(fd) != 0)
            e = errno;
        if (close(fd) != 0 && e == 0)
            e = errno;
        if (e != 0 && p->rc == 0)
            p->rc = errprintf(&p->err, "cannot fsync %s: %s", p->paths[f], strerror(e));
    }
    if (p->rc == 0) {
        json_t *m = json_pack("{sssisssiso}", "format", SUMS_FORMAT, "version", 1, "algorithm",
                              CK_ALGORITHM, "writer", p->ctx->self.group_rank, "files", files);
        files = NULL; /* m owns it */
        char *text = m ? json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        char path[4200];
        snprintf(path, sizeof(path), "%.3300s/checksums-%05d.json", p->tmpdir,
                 p->ctx->self.group_rank);
        if (text == NULL)
            p->rc = errprintf(&p->err, "out of memory");
        else
            p->rc = write_small(path, text, &p->err);
        free(text);
        json_decref(m);
    }
    json_decref(files);
    return NULL;
}

static void pending_free(bmt_ckpt_pending_t *p)
{
    for (int i = 0; i < p->npaths; i++)
        free(p->paths[i]);
    for (int i = 0; i < p->nbufs; i++)
        free(p->bufs[i]);
    free(p->paths);
    free(p->bufs);
    free(p->ops);
    free(p->blocks);
    free(p->user_json);
    free(p->config_json);
    json_decref(p->headers);
    free(p);
}

static int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* The first half of write_small: path.tmp written and fsync'd. */
static int write_small_tmp(const char *path, const char *text, bmt_error_t *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = fd < 0 || write_all(fd, text, strlen(text), 0) < 0 || fsync(fd) != 0 ? -1 : 0;
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && rc == 0) /* closed once, whatever came before */
        rc = -1, e = errno;
    if (rc < 0) {
        unlink(tmp);
        return errprintf(err, "cannot write %s: %s", tmp, strerror(e));
    }
    return 0;
}

/* The second half: path.tmp renamed to path. */
static int write_small_commit(const char *path, bmt_error_t *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return errprintf(err, "cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

/* Write a small file atomically: path.tmp, fsync, rename. */
static int write_small(const char *path, const char *text, bmt_error_t *err)
{
    int rc = write_small_tmp(path, text, err);
    return rc == 0 ? write_small_commit(path, err) : rc;
}

static int remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    int rc = 0;
    char sub[4200];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
            rc |= remove_tree(sub);
        else
            rc |= unlink(sub);
    }
    closedir(d);
    return rmdir(path) | rc;
}

/* A checkpoint's name: a directory of DIR beside DIR/latest (and latest.tmp
 * while it is written), so neither of those. */
static bool good_name(const char *s)
{
    if (s == NULL || *s == '\0' || *s == '.' || strlen(s) > 200 || strcmp(s, "latest") == 0 ||
        strcmp(s, "latest.tmp") == 0)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '-' || *s == '_'))
            return false;
    return true;
}

/* The optimizer step saved in DIR/name/train_state.json, or -1. */
static long long saved_step(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s/train_state.json", dir, name);
    json_t *j = json_load_file(path, 0, NULL);
    json_t *s = j ? json_object_get(j, "step") : NULL;
    long long v = json_is_integer(s) ? (long long)json_integer_value(s) : -1;
    json_decref(j);
    return v;
}

/* Remove the oldest complete checkpoints of dir beyond keep, never `latest`.
 * latest is the checkpoint this save just committed, whose every value was
 * checked finite: so the newest checkpoint known to be finite is never
 * removed, whatever the others are. */
static void prune(const char *dir, const char *latest, int keep)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct cand {
        long long step;
        char name[256];
    } *c = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long s;
        if (e->d_name[0] == '.' || strcmp(e->d_name, latest) == 0 ||
            (s = saved_step(dir, e->d_name)) < 0)
            continue;
        if (n == cap) {
            struct cand *m = realloc(c, sizeof(*c) * (size_t)(cap = cap ? 2 * cap : 16));
            if (m == NULL)
                break;
            c = m;
        }
        c[n].step = s;
        snprintf(c[n++].name, sizeof(c->name), "%s", e->d_name);
    }
    closedir(d);
    /* keep - 1 others besides latest: drop the oldest (smallest step, then name) */
    for (int drop = n - (keep - 1); drop > 0; drop--) {
        int o = 0;
        for (int i = 1; i < n; i++)
            if (c[i].step < c[o].step ||
                (c[i].step == c[o].step && strcmp(c[i].name, c[o].name) < 0))
                o = i;
        char path[4200], gone[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, c[o].name);
        /* Renamed out of the way first: removed file by file in place, a
         * crash after its train_state.json went left the rest as a step
         * directory no later prune took (it has no step) nor any sweep (it
         * is no .tmp-). .tmp-NAME~gone is swept by the next save or load
         * ('~' is in no checkpoint's name); where the rename fails (such a
         * directory is there already), the removal is in place, as before. */
        snprintf(gone, sizeof(gone), "%.3000s/.tmp-%.250s~gone", dir, c[o].name);
        remove_tree(rename(path, gone) == 0 ? gone : path);
        c[o] = c[--n];
    }
    free(c);
}

/* Where a re-saved name's old checkpoint waits while its replacement is
 * renamed in: DIR/.tmp-NAME~old ('~' is in no name, so no save's .tmp-NAME is
 * this; see restore_old). */
static void old_path(char *out, size_t len, const char *dir, const char *name)
{
    snprintf(out, len, "%.3000s/.tmp-%.250s~old", dir, name);
}

/* Commit the written, fsync'd tmpdir as DIR/NAME and point DIR/latest at it.
 * Everything that can fail for want of space or permission (latest's new text
 * in DIR/latest.tmp) comes first; then only renames, each undone if the next
 * fails: so a failure leaves DIR/NAME and DIR/latest as they were. A re-saved
 * name's old checkpoint steps aside to DIR/.tmp-NAME~old until the new one is
 * in; a crash in that window leaves DIR/NAME missing and the old one there,
 * which a load through DIR/latest reads (bmt_ckpt_resolve) and the next save
 * puts back (restore_old). */
static int commit(const char *dir, const char *name, const char *tmpdir, bmt_error_t *err)
{
    char final[4200], old[4200], latest[3100], latest_tmp[3200], text[300]; /* dir <= 3000 */
    snprintf(final, sizeof(final), "%s/%s", dir, name);
    snprintf(latest, sizeof(latest), "%.3000s/latest", dir);
    snprintf(latest_tmp, sizeof(latest_tmp), "%s.tmp", latest); /* write_small_tmp's */
    snprintf(text, sizeof(text), "%s\n", name);
    old_path(old, sizeof(old), dir, name);
    if (write_small_tmp(latest, text, err) < 0)
        return -1;
    struct stat st;
    bool replace = lstat(final, &st) == 0;
    if (replace && (remove_tree(old) != 0 || rename(final, old) != 0)) {
        int e = errno;
        unlink(latest_tmp);
        return errprintf(err, "cannot move %s aside to replace it: %s", final, strerror(e));
    }
    if (rename(tmpdir, final) != 0) {
        int e = errno;
        if (replace)
            rename(old, final);
        unlink(latest_tmp);
        return errprintf(err, "cannot rename %s to %s: %s", tmpdir, final, strerror(e));
    }
    if (write_small_commit(latest, err) < 0) {
        /* the new checkpoint back to tmpdir (cleanup_failed removes it), the
         * old one back in place */
        if (rename(final, tmpdir) == 0 && replace)
            rename(old, final);
        return -1;
    }
    /* Every rename is done: DIR/latest names the new checkpoint, which is
     * whole (its files and tmpdir were fsync'd), and undoing the renames now
     * would need the same failing directory. A failed fsync here is still an
     * error (the file system reports one, and a crash may lose the renames),
     * and err says which state the directory is in. */
    const int synced = fsync_path(dir), e = errno;
    if (replace)
        remove_tree(old);
    if (synced != 0)
        return errprintf(err,
                         "%s is written and %s names it, but the fsync of %s after the renames "
                         "failed: %s; a crash before the file system recovers may lose them "
                         "(check the file system before trusting %s)",
                         final, latest, dir, strerror(e), dir);
    return 0;
}

/* Rank 0: the index, config.json, train_state.json, then the renames. */
static int finish(bmt_ckpt_pending_t *p, bmt_error_t *err)
{
    bmt_ctx_t *ctx = p->ctx;
    json_t *wm = json_object(), *bl = json_array(), *user = NULL, *config = NULL;
    uint64_t total = 0;
    char fn[1024], fo[1024];
    for (int i = 0; i < p->nb; i++) {
        const bmt_block_t *b = p->blocks[i];
        block_file_name(b, false, fn, sizeof(fn));
        block_file_name(b, true, fo, sizeof(fo));
        for (int j = 0; j < b->nparams; j++) {
            json_object_set_new(wm, b->params[j].name, json_string(fn));
            total += (uint64_t)b->params[j].numel * bmt_dtype_size(b->params[j].dtype);
        }
        json_array_append_new(bl, json_pack("{sssssssi}", "name", b->name, "file", fn, "optim_file",
                                            p->opt ? fo : "", "params", b->nparams));
    }
    json_error_t je;
    /* (json_is_object evaluates its argument twice: load first, then test.) */
    if (p->user_json)
        user = json_loads(p->user_json, 0, &je);
    if (p->config_json)
        config = json_loads(p->config_json, 0, &je);
    if (p->user_json && !json_is_object(user)) {
        json_decref(wm), json_decref(bl), json_decref(user), json_decref(config);
        return errprintf(err, "checkpoint %s: the caller's state is not a JSON object", p->name);
    }
    if (p->config_json && !json_is_object(config)) {
        json_decref(wm), json_decref(bl), json_decref(user), json_decref(config);
        return errprintf(
            err, "checkpoint %s: the model's config (config.json) is not a JSON object", p->name);
    }
    json_t *sums = json_array();
    for (int r = 0; r < ctx->layout.gpus_per_group; r++) {
        char m[64];
        snprintf(m, sizeof(m), "checksums-%05d.json", r);
        json_array_append_new(sums, json_string(m));
    }
    json_t *index = json_pack("{s{sIss}so}", "metadata", "total_size", (json_int_t)total, "format",
                              "bmt", "weight_map", wm);
    json_t *ts = json_pack(
        "{sssisssIsIs{sisisisisi}sosbsbs{sssIsoso}}", "format", "bmt-checkpoint", "version",
        TRAIN_STATE_VERSION, "name", p->name, "step", (json_int_t)p->step, "skipped",
        (json_int_t)p->skipped, "layout", "groups", ctx->layout.groups, "gpus_per_group",
        ctx->layout.gpus_per_group, "gpus_per_node", ctx->layout.gpus_per_node, "nodes",
        ctx->layout.nodes, "world", ctx->layout.world, "blocks", bl, "optimizer", p->opt != NULL,
        "finite", 1, "checksums", "algorithm", CK_ALGORITHM, "unit", (json_int_t)CK_UNIT, "headers",
        json_incref(p->headers), "files", sums);
    if (user)
        json_object_set_new(ts, "user", user);
    char *it = json_dumps(index, JSON_INDENT(1) | JSON_SORT_KEYS);
    char *tt = json_dumps(ts, JSON_INDENT(1));
    char *ct = config ? json_dumps(config, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(index);
    json_decref(ts);
    json_decref(config);
    const char *tmpdir = p->tmpdir, *dir = p->dir, *name = p->name;
    char path[4200];
    int rc = it && tt && (ct || !p->config_json) ? 0 : errprintf(err, "out of memory");
    if (rc == 0) {
        snprintf(path, sizeof(path), "%.4000s/model.safetensors.index.json", tmpdir);
        rc = write_small(path, it, err);
    }
    if (rc == 0 && ct) {
        snprintf(path, sizeof(path), "%.4000s/config.json", tmpdir);
        rc = write_small(path, ct, err);
    }
    if (rc == 0) {
        snprintf(path, sizeof(path), "%.4000s/train_state.json", tmpdir);
        rc = write_small(path, tt, err);
    }
    free(it);
    free(tt);
    free(ct);
    if (rc == 0 && fsync_path(tmpdir) != 0)
        rc = errprintf(err, "cannot fsync %s: %s", tmpdir, strerror(errno));
    rc = rc == 0 ? commit(dir, name, tmpdir, err) : rc;
    if (rc == 0 && p->keep > 0)
        prune(dir, name, p->keep);
    return rc;
}

static int save_start(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                      const bmt_ckpt_config_t *cfg, bmt_ckpt_pending_t **out, bmt_error_t *err);

int bmt_ckpt_save_async(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                        const char *user_json, int keep, bmt_ckpt_pending_t **out, bmt_error_t *err)
{
    if (out == NULL)
        return errprintf(err, "bmt_ckpt_save_async: needs a pending pointer (out)");
    bmt_ckpt_config_t c = BMT_CKPT_CONFIG_INITIALIZER;
    c.user_json = user_json;
    c.keep = keep;
    c.async = 1;
    return save_start(list, opt, dir, name, &c, out, err);
}

/* After a failure every rank agreed on: rank 0 removes the temporary
 * directory, and the others wait for that (a barrier) before they return, so
 * that a job which ends on the error leaves nothing half-written behind. If the
 * barrier fails too, the next save or load in DIR removes what is left. */
static void cleanup_failed(bmt_ckpt_pending_t *p)
{
    bmt_error_t ignored;
    if (p->ctx->rank == 0) {
        remove_tree(p->tmpdir);
        if (p->made_dir)
            rmdir(p->dir); /* only if nothing else came into it meanwhile */
    }
    inflight_remove(p->tmpdir);
    bmt_barrier(p->ctx->world_comm, &ignored);
}

/* cfg->async: stage host copies of the shards; else, on cpu, write from them. */
static int save_start(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                      const bmt_ckpt_config_t *cfg, bmt_ckpt_pending_t **out, bmt_error_t *err)
{
    *out = NULL;
    if (list == NULL || dir == NULL || *dir == '\0')
        return errprintf(err, "bmt_ckpt_save: a block list and a directory are required");
    bmt_ctx_t *ctx = blocklist_ctx(list);
    if (cfg->magic != BMT_CKPT_CONFIG_MAGIC || cfg->size < sizeof(*cfg) ||
        cfg->version != BMT_CKPT_CONFIG_VERSION)
        return errprintf(err,
                         "rank %d: bmt_ckpt_save_ex: the config was not set up with "
                         "BMT_CKPT_CONFIG_INITIALIZER of this bmt",
                         ctx->rank);
    if (cfg->keep < 0 || (cfg->async != 0 && cfg->async != 1))
        return errprintf(err, "rank %d: bmt_ckpt_save_ex: keep must be >= 0 and async 0 or 1",
                         ctx->rank);
    if (strlen(dir) > 3000)
        return errprintf(err,
                         "rank %d: checkpoint directory name too long (%zu bytes; at most "
                         "3000)",
                         ctx->rank, strlen(dir));
    if (!good_name(name))
        return errprintf(err,
                         "rank %d: checkpoint name '%.900s': use letters, digits, '.', '-' and "
                         "'_' (not starting with '.'; not latest or latest.tmp, DIR's own files)",
                         ctx->rank, name ? name : "(null)");
    if (opt && optim_list(opt) != list)
        return errprintf(err, "rank %d: bmt_ckpt_save: the optimizer is not this list's",
                         ctx->rank);
    char busy[3300];
    if (inflight_any(busy, sizeof(busy)) != NULL)
        return errprintf(err,
                         "rank %d: checkpoint %.1000s/%.250s: the save into %.1000s is still "
                         "pending: call bmt_ckpt_finish before the next save",
                         ctx->rank, dir, name, busy);
    const struct list_state *st = blocklist_state(list);
    if (st->forward_pending || st->microbatches > 0)
        return errprintf(err,
                         "rank %d: bmt_ckpt_save between a forward or backward and the "
                         "optimizer step: save after bmt_optim_step",
                         ctx->rank);
    bmt_ckpt_pending_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (cfg->user_json && (p->user_json = strdup(cfg->user_json)) == NULL) ||
        (cfg->config_json && (p->config_json = strdup(cfg->config_json)) == NULL) ||
        (p->headers = json_object()) == NULL || (p->nb = unique_blocks(list, &p->blocks)) < 0) {
        if (p)
            pending_free(p);
        return errprintf(err, "rank %d: out of memory", ctx->rank);
    }
    p->ctx = ctx;
    p->opt = opt;
    p->keep = cfg->keep;
    p->copy = cfg->async || bmt_device(ctx) != BMT_DEVICE_CPU;
    if (opt) /* what train_state.json records, whatever steps run before finish */
        optim_counters(opt, &p->step, &p->skipped);
    snprintf(p->dir, sizeof(p->dir), "%s", dir);
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->tmpdir, sizeof(p->tmpdir), "%s/.tmp-%s", dir, name);
    int failed = 0;
    /* 1. rank 0: a fresh temporary directory with every file preallocated
     * (and what crashed saves left removed). The optimizer's deferred update
     * goes first: the state saved is the step's. */
    if (blocklist_flush(list, NULL, true, err) < 0 || bmt_device_synchronize(ctx, err) < 0)
        failed = 1;
    if (!failed && ctx->rank == 0) {
        p->made_dir = mkdir(dir, 0755) == 0;
        if (!p->made_dir && errno != EEXIST) {
            errprintf(err, "cannot create %s: %s", dir, strerror(errno));
            failed = 1;
        } else if (sweep_stale(dir, true),
                   remove_tree(p->tmpdir) != 0 || mkdir(p->tmpdir, 0755) != 0) {
            errprintf(err, "cannot create %s: %s", p->tmpdir, strerror(errno));
            failed = 1;
        }
        for (int i = 0; i < p->nb && !failed; i++)
            for (int k = 0; k < (opt ? 2 : 1) && !failed; k++) {
                struct flayout f;
                char fname[1024], path[4200], hex[17];
                uint64_t hash = 0;
                block_file_name(p->blocks[i], k == 1, fname, sizeof(fname));
                memset(&f, 0, sizeof(f));
                failed = join(path, sizeof(path), p->tmpdir, fname, err) < 0 ||
                         flayout_make(p->blocks[i], k == 1, &f, err) < 0 ||
                         create_file(path, &f, &hash, err) < 0;
                flayout_free(&f);
                ck_hex(hash, hex);
                if (!failed && json_object_set_new(p->headers, fname, json_string(hex)) != 0)
                    failed = errprintf(err, "out of memory") < 0;
            }
    }
    if (!failed && inflight_add(p->tmpdir) < 0)
        failed = errprintf(err, "rank %d: out of memory", ctx->rank) < 0;
    int rc = agree(ctx, failed, "preparing the checkpoint", err);
    /* 2. group 0 copies its shards to the host, checks that every value is
     *    finite, and hands them to a writer thread; the other groups hold the
     *    same shards and write nothing. */
    if (rc == 0) {
        failed = 0;
        for (int i = 0; i < p->nb && !failed && ctx->self.group == 0; i++)
            failed = stage_shards(p, p->blocks[i], err) < 0;
        if (!failed && ctx->self.group == 0) {
            if (pthread_create(&p->thread, NULL, writer, p) != 0)
                failed = errprintf(err, "cannot start the writer thread") < 0;
            else
                p->started = true;
        }
        rc = agree(ctx, failed, "staging the checkpoint", err);
    }
    if (rc < 0) {
        if (p->started)
            pthread_join(p->thread, NULL);
        cleanup_failed(p);
        pending_free(p);
        return errprefix(err, "checkpoint %s/%s: ", dir, name);
    }
    *out = p;
    return 0;
}

int bmt_ckpt_finish(bmt_ckpt_pending_t *p, bmt_error_t *err)
{
    if (p == NULL)
        return 0;
    bmt_ctx_t *ctx = p->ctx;
    int failed = 0;
    if (p->started) {
        pthread_join(p->thread, NULL);
        if (p->rc < 0) {
            if (err)
                *err = p->err;
            failed = 1;
        }
    }
    int rc = agree(ctx, failed, "writing the checkpoint", err);
    if (rc == 0) {
        failed = ctx->rank == 0 && finish(p, err) < 0;
        rc = agree(ctx, failed, "completing the checkpoint", err);
    }
    if (rc < 0)
        cleanup_failed(p);
    else
        inflight_remove(p->tmpdir);
    char where[3400];
    snprintf(where, sizeof(where), "%.3000s/%.250s", p->dir, p->name);
    pending_free(p);
    if (rc < 0)
        return errprefix(err, "checkpoint %s: ", where);
    /* Committed on every rank: one checkpoint_saved event for the monitor
     * plugins (rank 0's; the collector counts checkpoints, not ranks). */
    if (ctx->rank == 0) {
        bmt_error_t ignored;
        bmt_report_event(ctx, BMT_EVENT_CHECKPOINT_SAVED, where, &ignored);
    }
    return 0;
}

int bmt_ckpt_save_ex(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                     const bmt_ckpt_config_t *cfg, bmt_ckpt_pending_t **pending, bmt_error_t *err)
{
    bmt_ckpt_config_t defaults = BMT_CKPT_CONFIG_INITIALIZER;
    bmt_ckpt_pending_t *p = NULL;
    if (pending)
        *pending = NULL;
    if (cfg == NULL)
        cfg = &defaults;
    if (cfg->async == 1 && pending == NULL)
        return errprintf(err, "bmt_ckpt_save_ex: async needs a pending pointer");
    if (save_start(list, opt, dir, name, cfg, &p, err) < 0)
        return -1;
    if (cfg->async == 1) {
        *pending = p;
        return 0;
    }
    return bmt_ckpt_finish(p, err);
}

int bmt_ckpt_save(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                  const char *user_json, int keep, bmt_error_t *err)
{
    bmt_ckpt_config_t c = BMT_CKPT_CONFIG_INITIALIZER;
    c.user_json = user_json;
    c.keep = keep;
    return bmt_ckpt_save_ex(list, opt, dir, name, &c, NULL, err);
}

/* ------------------------------------------------------------ load */

/* bmt_ckpt_resolve's result dir into out (len bytes), or -1 with out as it
 * was: a caller that reads out after a failure finds no path cut short. */
static int resolved(const char *dir, char *out, size_t len, bmt_error_t *err)
{
    const size_t n = strlen(dir);
    if (n >= len)
        return errprintf(err, "bmt_ckpt_resolve: %s does not fit the %zu bytes given", dir, len);
    memcpy(out, dir, n + 1);
    return 0;
}

/* A train_state.json's counters and version, as every reader takes them (ts
 * as json_load_file gave it, NULL with je's reason): step and skipped whole
 * and not negative (a negative one would run the schedule and AdamW's bias
 * correction at a step that never was), a version this bmt reads. 0, or -1
 * with err naming p. */
static int state_check(const json_t *ts, const char *p, const json_error_t *je, bmt_error_t *err)
{
    const json_t *jstep = json_object_get(ts, "step"), *jskip = json_object_get(ts, "skipped"),
                 *jver = json_object_get(ts, "version");
    if (!json_is_object(ts) || !json_is_integer(jstep) || !json_is_integer(jskip))
        return errprintf(err, "%s: not a bmt checkpoint state (%s)", p,
                         ts ? "step or skipped missing" : je->text);
    const long long step0 = json_integer_value(jstep), skip0 = json_integer_value(jskip);
    if (step0 < 0 || skip0 < 0)
        return errprintf(err, "%s: step %lld, skipped %lld: a counter is negative (damaged)", p,
                         step0, skip0);
    const long long version = json_is_integer(jver) ? json_integer_value(jver) : 0;
    if (version < 1 || version > TRAIN_STATE_VERSION)
        return errprintf(err,
                         "%s: version %lld; this bmt reads versions 1 to %d (a newer bmt wrote "
                         "it?)",
                         p, version, TRAIN_STATE_VERSION);
    return 0;
}

int bmt_ckpt_resolve(const char *path, char *out, size_t len, bmt_error_t *err)
{
    if (path == NULL || strlen(path) > 3000)
        return errprintf(err, "bmt_ckpt_resolve: no path, or one too long");
    if (out == NULL || len == 0)
        return errprintf(err, "bmt_ckpt_resolve: no output buffer");
    char p[4200];
    struct stat st;
    snprintf(p, sizeof(p), "%s/train_state.json", path);
    if (stat(p, &st) == 0) /* out untouched unless it fits: never a path cut short */
        return resolved(path, out, len, err);
    snprintf(p, sizeof(p), "%s/latest", path);
    /* O_NONBLOCK: a FIFO named latest is refused, never waited on (a resume,
     * a verify or generate hung on one) */
    const int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT)
            return 1;
        return errprintf(err, "cannot read %s: %s", p, strerror(errno));
    }
    FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
    if (f == NULL) {
        close(fd);
        return errprintf(err,
                         "%s: not a regular file: a --save-dir's latest names its newest step "
                         "directory",
                         p);
    }
    char name[300] = "";
    char *got = fgets(name, sizeof(name), f);
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    if (got == NULL || !good_name(name))
        return errprintf(err, "%s does not name a checkpoint ('%.900s')", p, name);
    char found[3400]; /* path <= 3000, name <= 200 (good_name), ".tmp-" "~old" */
    snprintf(found, sizeof(found), "%s/%s", path, name);
    snprintf(p, sizeof(p), "%s/train_state.json", found);
    if (stat(p, &st) != 0) {
        /* a crash while name was re-saved left the old one aside (commit) */
        old_path(found, sizeof(found), path, name);
        snprintf(p, sizeof(p), "%s/train_state.json", found);
        if (stat(p, &st) != 0)
            return errprintf(err, "%s/latest names %s/%s, which has no train_state.json", path,
                             path, name);
    }
    return resolved(found, out, len, err);
}

/* ------------------------------------------------------------ checksums on load */

/* The checksums of a checkpoint's files: every writer's manifest merged, per
 * file, and the headers' hashes. */
struct sumfile {
    char *name;
    bmt_st_sum_t *v;
    size_t n, cap;
};

struct sumtab {
    struct sumfile *f;
    int n, cap;
    json_t *headers; /* borrowed from train_state.json's "checksums" */
};

static void sumtab_free(struct sumtab *t)
{
    for (int i = 0; i < t->n; i++) {
        free(t->f[i].name);
        free(t->f[i].v);
    }
    free(t->f);
    memset(t, 0, sizeof(*t));
}

static struct sumfile *sumtab_file(struct sumtab *t, const char *name, bool make)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->f[i].name, name) == 0)
            return &t->f[i];
    if (!make)
        return NULL;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        struct sumfile *f = realloc(t->f, sizeof(*f) * (size_t)cap);
        if (f == NULL)
            return NULL;
        t->f = f, t->cap = cap;
    }
    struct sumfile *f = &t->f[t->n];
    memset(f, 0, sizeof(*f));
    if ((f->name = strdup(name)) == NULL)
        return NULL;
    t->n++;
    return f;
}

/* Read the manifests that train_state.json's "checksums" lists. 0 with an
 * empty table for a checkpoint written before checksums existed (version 1). */
static int sumtab_load(const char *dir, json_t *ts, struct sumtab *t, bmt_error_t *err)
{
    memset(t, 0, sizeof(*t));
    json_t *ck = json_object_get(ts, "checksums");
    json_int_t version = json_integer_value(json_object_get(ts, "version"));
    if (ck == NULL && version < 2)
        return 0;
    json_t *files = json_object_get(ck, "files"), *headers = json_object_get(ck, "headers");
    const char *alg = json_string_value(json_object_get(ck, "algorithm"));
    if (!json_is_array(files) || !json_is_object(headers) || alg == NULL)
        return errprintf(err,
                         "%s/train_state.json: no valid \"checksums\" (files, headers, "
                         "algorithm): the checkpoint is damaged",
                         dir);
    if (strcmp(alg, CK_ALGORITHM) != 0)
        return errprintf(err, "%s/train_state.json: checksums by '%s'; this bmt knows %s", dir, alg,
                         CK_ALGORITHM);
    t->headers = headers;
    size_t i;
    json_t *m;
    json_array_foreach(files, i, m)
    {
        const char *mf = json_string_value(m);
        char path[4400];
        if (mf == NULL || strchr(mf, '/') || mf[0] == '.')
            return sumtab_free(t),
                   errprintf(err, "%s/train_state.json: a bad checksums file name", dir);
        if (join(path, sizeof(path), dir, mf, err) < 0)
            return sumtab_free(t), -1;
        json_error_t je;
        json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        json_t *jf = j ? json_object_get(j, "files") : NULL;
        const char *fmt = j ? json_string_value(json_object_get(j, "format")) : NULL;
        if (!json_is_object(jf) || fmt == NULL || strcmp(fmt, SUMS_FORMAT) != 0) {
            json_decref(j);
            sumtab_free(t);
            return errprintf(err, "%s: not a checksums file (%s): the checkpoint is damaged", path,
                             j ? "no format or files" : je.text);
        }
        const char *fname;
        json_t *arr;
        int rc = 0;
        json_object_foreach(jf, fname, arr)
        {
            struct sumfile *f = sumtab_file(t, fname, true);
            if (f == NULL || !json_is_array(arr)) {
                rc = errprintf(err, f ? "%s: entry '%s' is not a list" : "out of memory", path,
                               fname);
                break;
            }
            size_t k;
            json_t *u;
            json_array_foreach(arr, k, u)
            {
                json_int_t off = 0, len = 0;
                const char *hex = NULL;
                uint64_t h;
                if (json_unpack(u, "[IIs]", &off, &len, &hex) != 0 || off < 0 || len <= 0 ||
                    !ck_parse_hex(hex, &h)) {
                    rc = errprintf(err, "%s: entry %zu of '%s' is not [offset, length, xxh3]", path,
                                   k, fname);
                    break;
                }
                if (f->n == f->cap) {
                    size_t cap = f->cap ? 2 * f->cap : 64;
                    bmt_st_sum_t *v = realloc(f->v, sizeof(*v) * cap);
                    if (v == NULL) {
                        rc = errprintf(err, "out of memory");
                        break;
                    }
                    f->v = v, f->cap = cap;
                }
                f->v[f->n++] = (bmt_st_sum_t){ (uint64_t)off, (uint64_t)len, h };
            }
            if (rc < 0)
                break;
        }
        json_decref(j);
        if (rc < 0) {
            sumtab_free(t);
            return -1;
        }
    }
    return 0;
}

/* Attach file fname's checksums to st (a no-op for a version-1 checkpoint). */
static int sumtab_attach(const struct sumtab *t, bmt_st_t *st, const char *fname, bmt_error_t *err)
{
    if (t->headers == NULL)
        return 0;
    uint64_t hh;
    const char *hex = json_string_value(json_object_get(t->headers, fname));
    if (hex == NULL || !ck_parse_hex(hex, &hh))
        return errprintf(err, "%s: no checksum of its header in train_state.json", fname);
    struct sumfile *f = sumtab_file((struct sumtab *)t, fname, false);
    static const bmt_st_sum_t none;
    return bmt_st_set_checksums(st, fname, hh, f ? f->v : &none, f ? f->n : 0, err);
}

/* ------------------------------------------------------------ load */

struct src {
    bmt_st_t *st;
    int *idx; /* (nparams) tensor per parameter */
};

/* Values read are checked: a non-finite one fails the load, naming it. */
static int refuse_nonfinite(const bmt_st_t *st, int tensor, int64_t first, const void *v,
                            bmt_dtype_t t, int64_t count, bmt_error_t *err)
{
    int64_t bad = dtype_first_nonfinite(v, t, (size_t)count);
    if (bad < 0)
        return 0;
    const bmt_st_tensor_t *ti = bmt_st_tensor(st, tensor);
    const char *file = strrchr(ti->file, '/');
    return errprintf(err,
                     "%s: tensor '%s' holds %s at element %lld: a checkpoint with non-finite "
                     "values is refused (resume from an earlier one)",
                     file ? file + 1 : ti->file, ti->name, dtype_nonfinite_name(v, t, (size_t)bad),
                     (long long)(first + bad));
}

static int read_piece(void *user, const bmt_block_t *b, int param, int64_t first, int64_t count,
                      void *dst, bmt_dtype_t dtype, bmt_error_t *err)
{
    (void)b;
    const struct src *s = user;
    if (bmt_st_read(s->st, s->idx[param], first, count, dst, dtype, err) < 0)
        return -1;
    return refuse_nonfinite(s->st, s->idx[param], first, dst, dtype, count, err);
}

/* Tensor `name` of st with the parameter's shape and the dtype a save writes
 * for it (want: the parameter's, or f32 for the optimizer's state): its index.
 * Another dtype is another model's (or a damaged file), not a conversion to
 * make quietly. */
static int expect(const bmt_st_t *st, const char *file, const struct param *p, const char *name,
                  bmt_dtype_t want_dtype, bmt_error_t *err)
{
    int i = bmt_st_find(st, name);
    const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
    if (t == NULL)
        return errprintf(err, "%s has no tensor '%s'", file, name);
    bool same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++)
        same = t->shape[d] == p->shape[d];
    if (!same) {
        char got[96] = "", want[96] = "";
        for (int d = 0; d < t->ndim && d < 8; d++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%lld", d ? ", " : "",
                     (long long)t->shape[d]);
        for (int d = 0; d < p->ndim; d++)
            snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%lld", d ? ", " : "",
                     (long long)p->shape[d]);
        return errprintf(err, "%s: tensor '%s' is (%s), the model's is (%s)", file, name, got,
                         want);
    }
    if (strcmp(bmt_st_dtype_name(t->dtype), st_dtype(want_dtype)) != 0)
        return errprintf(err, "%s: tensor '%s' is %s, the model's is %s", file, name,
                         bmt_st_dtype_name(t->dtype), st_dtype(want_dtype));
    return i;
}

/* Every tensor of st must be one the model expects (idx[k][j] for the kinds
 * first..last): an extra one means another model. */
static int no_extra(const bmt_st_t *st, const char *file, const bmt_block_t *b, int *const idx[4],
                    int first, int last, bmt_error_t *err)
{
    int want = 0;
    for (int k = first; k <= last; k++)
        for (int j = 0; j < b->nparams; j++)
            want += !(k == T_MASTER && b->params[j].dtype == BMT_F32);
    if (bmt_st_count(st) == want)
        return 0;
    for (int i = 0; i < bmt_st_count(st); i++) {
        bool known = false;
        for (int k = first; k <= last && !known; k++)
            for (int j = 0; j < b->nparams && !known; j++)
                known = !(k == T_MASTER && b->params[j].dtype == BMT_F32) && idx[k][j] == i;
        if (!known)
            return errprintf(err,
                             "%s has tensor '%s', which block %s of the model does not have (%d "
                             "tensors; the model expects %d): a checkpoint of another model",
                             file, bmt_st_tensor(st, i)->name, b->name, bmt_st_count(st), want);
    }
    return errprintf(err, "%s has %d tensors; the model expects %d", file, bmt_st_count(st), want);
}

/* The blocks train_state.json lists must be the list's, no more, no fewer. */
static int same_blocks(const char *dir, json_t *ts, bmt_block_t **blocks, int nb, bmt_error_t *err)
{
    json_t *bl = json_object_get(ts, "blocks");
    if (!json_is_array(bl))
        return errprintf(err, "%s/train_state.json has no list of blocks", dir);
    size_t i;
    json_t *b;
    json_array_foreach(bl, i, b)
    {
        const char *name = json_string_value(json_object_get(b, "name"));
        bool found = false;
        for (int k = 0; name && k < nb && !found; k++)
            found = strcmp(blocks[k]->name, name) == 0;
        if (!found)
            return errprintf(err,
                             "%s has block '%s', which the model does not have (the checkpoint "
                             "has %zu blocks, the model %d): a checkpoint of another model",
                             dir, name ? name : "(unnamed)", json_array_size(bl), nb);
    }
    for (int k = 0; k < nb; k++) {
        bool found = false;
        json_array_foreach(bl, i, b)
        {
            const char *name = json_string_value(json_object_get(b, "name"));
            found = found || (name && strcmp(blocks[k]->name, name) == 0);
        }
        if (!found)
            return errprintf(err,
                             "%s has no block '%s' (the checkpoint has %zu blocks, the model %d)",
                             dir, blocks[k]->name, json_array_size(bl), nb);
    }
    return 0;
}

/* The f32 master h (host, shard elements) into a split master: its high
 * halves into the bf16 shard, its low halves into lo. */
static int split_master(bmt_ctx_t *ctx, const struct dgroup *d, uint16_t *lo, const float *h,
                        bmt_error_t *err)
{
    if (bmt_device(ctx) == BMT_DEVICE_CPU) {
        kern_split_host(h, d->param, lo, d->shard);
        return 0;
    }
    const size_t half = dsize(BMT_BF16, d->shard);
    uint16_t *two = malloc(2 * half + 1);
    if (two == NULL)
        return errprintf(err, "out of memory");
    kern_split_host(h, two, two + d->shard, d->shard);
    int rc = bmt_mem_upload(ctx, d->param, two, half, err);
    if (rc == 0)
        rc = bmt_mem_upload(ctx, lo, two + d->shard, half, err);
    free(two);
    return rc;
}

/* Read this rank's pieces of the optimizer tensors of one dtype group into the
 * device shards (f32). */
static int load_state(bmt_ctx_t *ctx, const bmt_block_t *b, const optim_view_t *ov, bmt_st_t *st,
                      int *const idx[4], bmt_error_t *err)
{
    const struct dgroup *d = ov->d;
    float *dst[4] = { NULL, ov->m, ov->v, d->dtype == BMT_F32 ? NULL : ov->master };
    const bool split = ov->lo != NULL && d->dtype != BMT_F32;
    int rc = 0;
    for (int k = T_EXP_AVG; k <= T_MASTER && rc == 0; k++) {
        if (dst[k] == NULL && !(k == T_MASTER && split))
            continue;
        /* On cpu straight into the state (names and shapes are checked already);
         * else through a host buffer of zeros (gaps and padding stay zero). A
         * split master goes through one too, and is split into the shard (its
         * high half, replacing what block_load put there) and the low halves. */
        const bool direct = bmt_device(ctx) == BMT_DEVICE_CPU && dst[k] != NULL;
        float *h = direct ? dst[k] : calloc(d->shard + 1, sizeof(float));
        if (h == NULL)
            return errprintf(err, "out of memory");
        for (int j = 0; j < b->nparams && rc == 0; j++) {
            const struct param *p = &b->params[j];
            if (&b->groups[p->group] != d)
                continue;
            size_t lo, hi;
            if (!block_in_shard(p, d, &lo, &hi))
                continue;
            float *at = h + (lo - d->shard_first);
            rc = bmt_st_read(st, idx[k][j], (int64_t)(lo - p->offset), (int64_t)(hi - lo), at,
                             BMT_F32, err);
            if (rc == 0)
                rc = refuse_nonfinite(st, idx[k][j], (int64_t)(lo - p->offset), at, BMT_F32,
                                      (int64_t)(hi - lo), err);
        }
        if (rc == 0 && dst[k] == NULL) /* the split master */
            rc = split_master(ctx, d, ov->lo, h, err);
        else if (rc == 0 && !direct)
            rc = bmt_mem_upload(ctx, dst[k], h, d->shard * sizeof(float), err);
        if (!direct)
            free(h);
    }
    return rc;
}

/* The directory that holds checkpoint directory dir ("DIR/step-5" -> "DIR"). */
static void parent_dir(const char *dir, char *out, size_t len)
{
    snprintf(out, len, "%s", dir);
    char *slash = strrchr(out, '/');
    if (slash == NULL)
        snprintf(out, len, ".");
    else if (slash == out)
        out[1] = '\0';
    else
        *slash = '\0';
}

int bmt_ckpt_load(bmt_blocklist_t *list, bmt_optim_t *opt, const char *path, char **user_json,
                  bmt_error_t *err)
{
    if (user_json)
        *user_json = NULL;
    if (list == NULL || path == NULL)
        return errprintf(err, "bmt_ckpt_load: a block list and a path are required");
    bmt_ctx_t *ctx = blocklist_ctx(list);
    const struct list_state *ls = blocklist_state(list);
    if (ls->forward_pending || ls->microbatches > 0)
        return errprintf(err, "rank %d: bmt_ckpt_load between a forward and the optimizer step",
                         ctx->rank);
    if (opt && optim_list(opt) != list)
        return errprintf(err, "rank %d: bmt_ckpt_load: the optimizer is not this list's",
                         ctx->rank);
    /* A deferred update would land on the loaded state: apply it first. */
    if (blocklist_flush(list, NULL, true, err) < 0 || bmt_device_synchronize(ctx, err) < 0)
        return -1;
    char dir[4200], p[4400];
    int r = bmt_ckpt_resolve(path, dir, sizeof(dir), err);
    if (r != 0)
        return r > 0 ? errprintf(err, "%s: no checkpoint (no train_state.json, no latest)", path)
                     : -1;
    if (ctx->rank == 0) { /* what crashed saves left beside it */
        char parent[4200];
        parent_dir(dir, parent, sizeof(parent));
        sweep_stale(parent, false);
    }
    snprintf(p, sizeof(p), "%s/train_state.json", dir);
    json_error_t je;
    json_t *ts = json_load_file(p, 0, &je);
    json_t *jstep = ts ? json_object_get(ts, "step") : NULL;
    json_t *jskip = ts ? json_object_get(ts, "skipped") : NULL;
    json_t *jopt = ts ? json_object_get(ts, "optimizer") : NULL;
    if (state_check(ts, p, &je, err) < 0) {
        json_decref(ts);
        return -1;
    }
    if (opt && !json_is_true(jopt)) {
        json_decref(ts);
        return errprintf(err, "%s was saved without optimizer state", dir);
    }
    struct sumtab sums;
    bmt_block_t **blocks = NULL;
    int nb = unique_blocks(list, &blocks), rc = nb < 0 ? errprintf(err, "out of memory") : 0;
    if (rc == 0 && sumtab_load(dir, ts, &sums, err) < 0) {
        rc = -1;
        memset(&sums, 0, sizeof(sums));
    } else if (rc < 0) {
        memset(&sums, 0, sizeof(sums));
    }
    if (rc == 0)
        rc = same_blocks(dir, ts, blocks, nb, err);
    bmt_st_t **sts = calloc((size_t)(2 * (nb > 0 ? nb : 1)), sizeof(*sts));
    int **idx = calloc((size_t)(8 * (nb > 0 ? nb : 1)), sizeof(*idx));
    if (rc == 0 && (sts == NULL || idx == NULL))
        rc = errprintf(err, "out of memory");
    /* Every file, name, shape and dtype first: a mismatch loads nothing. */
    for (int i = 0; i < nb && rc == 0; i++) {
        const bmt_block_t *b = blocks[i];
        for (int f = 0; f < (opt ? 2 : 1) && rc == 0; f++) {
            char fname[1024];
            block_file_name(b, f == 1, fname, sizeof(fname));
            if (join(p, sizeof(p), dir, fname, err) < 0 ||
                (sts[2 * i + f] = bmt_st_open(p, err)) == NULL ||
                sumtab_attach(&sums, sts[2 * i + f], fname, err) < 0) {
                rc = -1;
                break;
            }
            const int k0 = f ? T_EXP_AVG : T_PARAM, k1 = f ? T_MASTER : T_PARAM;
            for (int k = k0; k <= k1 && rc == 0; k++) {
                int *ix = idx[8 * i + k] = calloc((size_t)b->nparams + 1, sizeof(int));
                if (ix == NULL)
                    rc = errprintf(err, "out of memory");
                for (int j = 0; j < b->nparams && rc == 0; j++) {
                    ix[j] = -1;
                    if (k == T_MASTER && b->params[j].dtype == BMT_F32)
                        continue;
                    /* as long as the save made it: a name cut short here
                     * made a checkpoint that saved fine unloadable */
                    size_t tl = strlen(b->params[j].name) + strlen(suffix[k]) + 1;
                    char *tn = malloc(tl);
                    if (tn == NULL) {
                        rc = errprintf(err, "out of memory");
                        break;
                    }
                    snprintf(tn, tl, "%s%s", b->params[j].name, suffix[k]);
                    const bmt_dtype_t want = k == T_PARAM ? b->params[j].dtype : BMT_F32;
                    if ((ix[j] = expect(sts[2 * i + f], p, &b->params[j], tn, want, err)) < 0)
                        rc = -1;
                    free(tn);
                }
            }
            if (rc == 0)
                rc = no_extra(sts[2 * i + f], p, b, &idx[8 * i], k0, k1, err);
        }
    }
    /* A group whose values live in a master_only optimizer loads through it,
     * and so does one whose master is split (master_only 2): its parameters
     * are half of the master, whose other half only the optimizer holds. */
    if (rc == 0 && opt == NULL && ls->optim && optim_splits(ls->optim))
        rc = errprintf(err, "this block list's optimizer keeps each bf16 master split with the "
                            "parameters (master_only 2): pass that optimizer to bmt_ckpt_load, "
                            "or destroy it before loading parameters alone");
    for (int i = 0; i < nb && rc == 0; i++)
        for (int g = 0; g < blocks[i]->ngroups && rc == 0; g++)
            if (blocks[i]->groups[g].param == NULL && opt == NULL)
                rc = errprintf(err,
                               "block %.900s keeps its parameters in its optimizer (master_only): "
                               "pass that optimizer to bmt_ckpt_load",
                               blocks[i]->name);
    /* A gathered block's load fails (block_load): say so before any block is
     * written, not after the blocks before it were loaded. */
    for (int i = 0; i < nb && rc == 0; i++)
        if (blocks[i]->full)
            rc = errprintf(err,
                           "block %.900s is gathered (bmt_block_gather): release it before "
                           "loading; nothing was loaded",
                           blocks[i]->name);
    const bool began = rc == 0; /* from here a failure leaves a partial load */
    for (int i = 0; i < nb && rc == 0; i++) {
        struct src s = { sts[2 * i], idx[8 * i + T_PARAM] };
        rc = block_load(blocks[i], read_piece, &s, true, err);
        for (int k = 0; opt && rc == 0 && k < optim_count(opt); k++) {
            optim_view_t ov;
            optim_get(opt, k, &ov);
            if (ov.block == blocks[i])
                rc = load_state(ctx, blocks[i], &ov, sts[2 * i + 1], &idx[8 * i], err);
        }
    }
    if (rc == 0 && opt)
        optim_set_counters(opt, (int64_t)json_integer_value(jstep),
                           (int64_t)json_integer_value(jskip));
    if (opt && began)
        optim_set_loaded(opt, rc == 0);
    json_t *user = json_object_get(ts, "user");
    if (rc == 0 && user_json && json_is_object(user))
        *user_json = json_dumps(user, JSON_COMPACT);
    for (int i = 0; sts && i < 2 * nb; i++)
        bmt_st_close(sts[i]);
    for (int i = 0; idx && i < 8 * nb; i++)
        free(idx[i]);
    free(sts);
    free(idx);
    free(blocks);
    sumtab_free(&sums);
    json_decref(ts);
    if (rc == 0 && bmt_device_synchronize(ctx, err) < 0)
        rc = -1;
    return rc < 0 ? errprefix(err, "rank %d: loading %s: ", ctx->rank, dir) : 0;
}

/* ------------------------------------------------------------ verify */

/* Every value of tensor i of st finite, read in chunks (checked bytes when
 * st has checksums). */
static int verify_finite(bmt_st_t *st, int i, const char *file, bmt_error_t *err)
{
    const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
    const bmt_dtype_t as = t->dtype == BMT_ST_F64 ? BMT_F64 : BMT_F32;
    const int64_t chunk = 1 << 18;
    void *buf = malloc((size_t)chunk * 8);
    if (buf == NULL)
        return errprintf(err, "out of memory");
    int rc = 0;
    for (int64_t at = 0; at < t->numel && rc == 0; at += chunk) {
        int64_t n = t->numel - at < chunk ? t->numel - at : chunk;
        rc = bmt_st_read(st, i, at, n, buf, as, err);
        int64_t bad = rc == 0 ? dtype_first_nonfinite(buf, as, (size_t)n) : -1;
        if (bad >= 0)
            rc = errprintf(err, "%s: tensor '%s' holds %s at element %lld", file, t->name,
                           dtype_nonfinite_name(buf, as, (size_t)bad), (long long)(at + bad));
    }
    free(buf);
    return rc;
}

/* One file of the checkpoint: header, checksums of every byte, values. For
 * the model file (optim false) every tensor must be in the index's weight_map
 * under this file; for the optimizer's, every tensor must be a state of a
 * parameter of model (same shape, F32, a master only for a parameter not in
 * F32), and every parameter must have all of its states. */
static int verify_file(const char *dir, const char *fname, const struct sumtab *sums, json_t *wm,
                       const bmt_st_t *model, bmt_st_t **out, uint64_t *total,
                       bmt_ckpt_report_t *rep, bmt_error_t *err)
{
    char path[4400];
    struct stat sb;
    bmt_st_t *st = join(path, sizeof(path), dir, fname, err) < 0 ? NULL : bmt_st_open(path, err);
    if (st == NULL)
        return -1;
    uint64_t bytes = 0;
    int rc = sumtab_attach(sums, st, fname, err);
    if (rc == 0)
        rc = bmt_st_verify(st, &bytes, err);
    for (int i = 0; i < bmt_st_count(st) && rc == 0; i++) {
        const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
        if (t->dtype != BMT_ST_F32 && t->dtype != BMT_ST_BF16 && t->dtype != BMT_ST_F16 &&
            t->dtype != BMT_ST_F64) {
            rc = errprintf(err, "%s: tensor '%s' is %s, not a float type", fname, t->name,
                           bmt_st_dtype_name(t->dtype));
            break;
        }
        if (model == NULL) {
            const char *in = json_string_value(json_object_get(wm, t->name));
            if (in == NULL || strcmp(in, fname) != 0) {
                rc = errprintf(err, "%s: tensor '%s' is %s the index's weight_map%s%s", fname,
                               t->name, in ? "in" : "not in", in ? ", which puts it in " : "",
                               in ? in : "");
                break;
            }
            *total += (uint64_t)t->nbytes;
        } else {
            const char *dot = strrchr(t->name, '.');
            char *pname = strndup(t->name, dot ? (size_t)(dot - t->name) : 0); /* whole */
            if (pname == NULL) {
                rc = errprintf(err, "out of memory");
                break;
            }
            const bmt_st_tensor_t *pt = bmt_st_tensor(model, bmt_st_find(model, pname));
            free(pname);
            bool kind = dot && (strcmp(dot, ".exp_avg") == 0 || strcmp(dot, ".exp_avg_sq") == 0 ||
                                strcmp(dot, ".master") == 0);
            bool shape = pt && pt->ndim == t->ndim;
            for (int d = 0; shape && d < t->ndim; d++)
                shape = pt->shape[d] == t->shape[d];
            if (!kind || !shape) {
                rc = errprintf(err,
                               "%s: tensor '%s' is not the exp_avg, exp_avg_sq or master of a "
                               "parameter of the same shape in the model's file",
                               fname, t->name);
                break;
            }
            if (strcmp(dot, ".master") == 0 && pt->dtype == BMT_ST_F32) {
                rc = errprintf(err,
                               "%s: tensor '%s': an F32 parameter is its own master, a save "
                               "writes none for it (bmt_ckpt_load refuses it)",
                               fname, t->name);
                break;
            }
            if (t->dtype != BMT_ST_F32) { /* as the load: no quiet conversion */
                rc = errprintf(err,
                               "%s: tensor '%s' is %s: the optimizer's state is saved as F32 "
                               "(bmt_ckpt_load refuses it)",
                               fname, t->name, bmt_st_dtype_name(t->dtype));
                break;
            }
        }
        rc = verify_finite(st, i, fname, err);
        rep->tensors++;
    }
    /* The optimizer's file holds every state of every parameter: exp_avg,
     * exp_avg_sq and, for a parameter not in F32, its master (a resume
     * with the optimizer refuses a checkpoint without one). */
    for (int i = 0; model && rc == 0 && i < bmt_st_count(model); i++) {
        const bmt_st_tensor_t *pt = bmt_st_tensor(model, i);
        for (int k = T_EXP_AVG; k <= T_MASTER && rc == 0; k++) {
            if (k == T_MASTER && pt->dtype == BMT_ST_F32)
                continue; /* as flayout_make: an f32 parameter is its own master */
            const size_t len = strlen(pt->name) + strlen(suffix[k]) + 1;
            char *name = malloc(len);
            if (name == NULL) {
                rc = errprintf(err, "out of memory");
                break;
            }
            snprintf(name, len, "%s%s", pt->name, suffix[k]);
            if (bmt_st_find(st, name) < 0)
                rc = errprintf(err,
                               "%s: no tensor '%s': the optimizer's state of parameter '%s' is "
                               "incomplete (a resume with the optimizer refuses it)",
                               fname, name, pt->name);
            free(name);
        }
    }
    if (rc == 0 && stat(path, &sb) == 0)
        rep->bytes += (uint64_t)sb.st_size;
    rep->files += rc == 0;
    if (rc < 0 || out == NULL)
        bmt_st_close(st);
    else
        *out = st;
    return rc;
}

int bmt_ckpt_verify(const char *path, bmt_ckpt_report_t *report, bmt_error_t *err)
{
    bmt_ckpt_report_t local;
    bmt_ckpt_report_t *rep = report ? report : &local;
    memset(rep, 0, sizeof(*rep));
    rep->step = -1;
    char dir[4096], p[4400];
    int r = bmt_ckpt_resolve(path, dir, sizeof(dir), err);
    if (r != 0)
        return r > 0 ? errprintf(err, "%s: no checkpoint (no train_state.json, no latest)", path)
                     : -1;
    snprintf(rep->dir, sizeof(rep->dir), "%s", dir);
    snprintf(p, sizeof(p), "%s/train_state.json", dir);
    json_error_t je;
    json_t *ts = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    json_t *bl = ts ? json_object_get(ts, "blocks") : NULL;
    json_t *jstep = ts ? json_object_get(ts, "step") : NULL;
    if (!json_is_object(ts) || !json_is_array(bl) || !json_is_integer(jstep) ||
        !json_is_integer(json_object_get(ts, "version"))) {
        json_decref(ts);
        return errprintf(err, "%s: not a bmt checkpoint state (%s)", p,
                         ts ? "version, step or blocks missing" : je.text);
    }
    /* What bmt_ckpt_load refuses, refused here too: a checkpoint that
     * verifies must load (a missing "skipped" or a newer version passed). */
    if (state_check(ts, p, &je, err) < 0) {
        json_decref(ts);
        return -1;
    }
    rep->step = (int64_t)json_integer_value(jstep);
    rep->optimizer = json_is_true(json_object_get(ts, "optimizer"));
    rep->blocks = (int)json_array_size(bl);
    struct sumtab sums;
    int rc = sumtab_load(dir, ts, &sums, err);
    if (rc == 0 && sums.headers == NULL)
        rc = errprintf(err,
                       "%s has no checksums (written by a bmt before version %d of "
                       "train_state.json): nothing to verify the bytes against",
                       dir, TRAIN_STATE_VERSION);
    if (rc == 0 && !json_is_true(json_object_get(ts, "finite")))
        rc = errprintf(err,
                       "%s: train_state.json does not say the save checked every value "
                       "(\"finite\": true)",
                       p);
    json_t *index = NULL, *wm = NULL;
    if (rc == 0) {
        snprintf(p, sizeof(p), "%s/%s", dir, BMT_ST_INDEX_NAME);
        index = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
        wm = index ? json_object_get(index, "weight_map") : NULL;
        if (!json_is_object(wm))
            rc = errprintf(err, "%s: not an index with a weight_map (%s)", p,
                           index ? "no weight_map" : je.text);
    }
    uint64_t total = 0;
    size_t i;
    json_t *b;
    json_array_foreach(bl, i, b)
    {
        if (rc < 0)
            break;
        const char *fn = json_string_value(json_object_get(b, "file"));
        const char *fo = json_string_value(json_object_get(b, "optim_file"));
        if (fn == NULL || strchr(fn, '/') || (rep->optimizer && (fo == NULL || strchr(fo, '/')))) {
            rc = errprintf(err, "%s/train_state.json: block %zu has no valid file names", dir, i);
            break;
        }
        bmt_st_t *model = NULL;
        rc =
            verify_file(dir, fn, &sums, wm, NULL, rep->optimizer ? &model : NULL, &total, rep, err);
        if (rc == 0 && rep->optimizer)
            rc = verify_file(dir, fo, &sums, wm, model, NULL, &total, rep, err);
        bmt_st_close(model);
    }
    /* The index names no tensor that no file holds, and its total is right. */
    if (rc == 0) {
        json_int_t want =
            json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size"));
        size_t count = 0, files = 0;
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v) count++;
        (void)files;
        size_t held = 0;
        json_array_foreach(bl, i, b)
        {
            char fp[4400];
            bmt_st_t *st =
                join(fp, sizeof(fp), dir, json_string_value(json_object_get(b, "file")), err) < 0
                    ? NULL
                    : bmt_st_open(fp, err);
            if (st == NULL) {
                rc = -1;
                break;
            }
            held += (size_t)bmt_st_count(st);
            bmt_st_close(st);
        }
        if (rc == 0 && count != held)
            rc = errprintf(err, "%s: the weight_map names %zu tensors; the files hold %zu", p,
                           count, held);
        if (rc == 0 && (uint64_t)want != total)
            rc = errprintf(err, "%s: total_size is %lld; the tensors hold %llu bytes", p,
                           (long long)want, (unsigned long long)total);
    }
    if (rc == 0) {
        snprintf(p, sizeof(p), "%s/config.json", dir);
        struct stat sb;
        if (stat(p, &sb) == 0) {
            json_t *c = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
            rep->has_config = true;
            if (!json_is_object(c))
                rc = errprintf(err, "%s: not a JSON object (%s)", p, c ? "another type" : je.text);
            json_decref(c);
        }
    }
    json_decref(index);
    sumtab_free(&sums);
    json_decref(ts);
    return rc < 0 ? errprefix(err, "verifying %s: ", dir) : 0;
}
