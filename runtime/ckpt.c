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
#include "comm.h"
#include "bmt/safetensors.h"
#include "ctx.h"
#include "error.h"
#include "fault.h"

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
            struct ftensor *t = &f->t[f->n++];
            size_t len = strlen(p->name) + strlen(suffix[k]) + 1;
            if ((t->name = malloc(len)) == NULL)
                break;
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

/* "transformer.h.3" -> "transformer.h.3.safetensors" (".optim" before it for
 * the optimizer's); '/' would leave the directory, so it becomes '_'. */
static void file_name(const bmt_block_t *b, bool optim, char *out, size_t len)
{
    snprintf(out, len, "%s%s.safetensors", b->name, optim ? ".optim" : "");
    for (char *c = out; *c; c++)
        if (*c == '/')
            *c = '_';
}

/* Every rank learns whether any rank failed: returns 0, or -1 with err (this
 * rank's own message if it failed, else "another rank failed: ..."). */
static int agree(bmt_ctx_t *ctx, int failed, const char *what, bmt_error_t *err)
{
    double v = failed ? 1 : 0;
    bmt_error_t e2;
    if (bmt_all_reduce_host_f64(ctx->world_comm, &v, 1, BMT_MAX, &e2) < 0) {
        if (!failed) /* a failed rank keeps its own message */
            *err = e2;
        return -1;
    }
    if (failed)
        return -1;
    if (v > 0)
        return errprintf(err, "rank %d: %s failed on another rank (its output says why)", ctx->rank,
                         what);
    return 0;
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

/* Rank 0: create and preallocate a file of the layout, header written. */
static int create_file(const char *path, const struct flayout *f, bmt_error_t *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    uint64_t hl = f->header_len, total = 8 + hl + f->data_len;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(hl >> (8 * i));
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
    char *user_json;
    int keep;
    char **paths;
    int npaths;
    void **bufs;
    int nbufs, capbufs;
    struct wop *ops;
    int nops, capops;
    pthread_t thread;
    bool started;
    int64_t step; /* the optimizer's, for BMT_FAULT=save:... */
    bool copy;    /* stage host copies (async, or device memory); else write the shards */
    int rc;       /* the writer's: 0 or -1 with err */
    bmt_error_t err;
};

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
        return errprintf(err, "out of memory staging block %.40s", block);
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
        file_name(b, k == 1, name, sizeof(name));
        snprintf(path, sizeof(path), "%.3000s/%.1000s", p->tmpdir, name);
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
            rc = errprintf(err, "block %.40s is not this optimizer's", b->name);
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
            else if (!p->copy)
                stage[k] = (void *)src[k]; /* cpu, synchronous: write from the shard */
            else if ((stage[k] = keep_buf(p, d->shard * isz[k])) == NULL)
                rc = errprintf(err, "out of memory staging block %.40s", b->name);
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
                if (add_op(p, file[f], at, (char *)stage[ft->kind] + (lo - d->shard_first) * sz,
                           (hi - lo) * sz) < 0)
                    rc = errprintf(err, "out of memory");
            }
    }
    for (int k = 0; k < 2; k++)
        flayout_free(&fl[k]);
    return rc;
}

/* The writer thread: every staged piece with pwrite, then fsync (by the writer:
 * on a shared file system the data is this node's until it does). */
static void *writer(void *arg)
{
    bmt_ckpt_pending_t *p = arg;
    for (int f = 0; f < p->npaths && p->rc == 0; f++) {
        int fd = open(p->paths[f], O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            p->rc = errprintf(&p->err, "cannot open %s: %s", p->paths[f], strerror(errno));
            break;
        }
        for (int i = 0; i < p->nops && p->rc == 0; i++) {
            if (p->ops[i].file != f)
                continue;
            if (write_all(fd, p->ops[i].src, p->ops[i].n, p->ops[i].off) < 0)
                p->rc = errprintf(&p->err, "cannot write %s: %s", p->paths[f], strerror(errno));
            fault_point(p->ctx, FAULT_SAVE, p->step); /* BMT_FAULT=save:...: tests only */
        }
        if ((fsync(fd) != 0 || close(fd) != 0) && p->rc == 0)
            p->rc = errprintf(&p->err, "cannot fsync %s: %s", p->paths[f], strerror(errno));
    }
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

/* Write a small file atomically: path.tmp, fsync, rename. */
static int write_small(const char *path, const char *text, bmt_error_t *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write_all(fd, text, strlen(text), 0) < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        return errprintf(err, "cannot write %s: %s", tmp, strerror(e));
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return errprintf(err, "cannot write %s: %s", path, strerror(e));
    }
    return 0;
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

static bool good_name(const char *s)
{
    if (s == NULL || *s == '\0' || *s == '.' || strlen(s) > 200)
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

/* Remove the oldest complete checkpoints of dir beyond keep (never `latest`). */
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
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, c[o].name);
        remove_tree(path);
        c[o] = c[--n];
    }
    free(c);
}

/* Rank 0: the index and train_state.json, then the renames. */
static int finish(bmt_ctx_t *ctx, bmt_block_t **blocks, int nb, bmt_optim_t *opt, const char *dir,
                  const char *tmpdir, const char *name, const char *user_json, int keep,
                  bmt_error_t *err)
{
    json_t *wm = json_object(), *bl = json_array(), *user = NULL;
    uint64_t total = 0;
    char fn[1024], fo[1024];
    for (int i = 0; i < nb; i++) {
        const bmt_block_t *b = blocks[i];
        file_name(b, false, fn, sizeof(fn));
        file_name(b, true, fo, sizeof(fo));
        for (int j = 0; j < b->nparams; j++) {
            json_object_set_new(wm, b->params[j].name, json_string(fn));
            total += (uint64_t)b->params[j].numel * bmt_dtype_size(b->params[j].dtype);
        }
        json_array_append_new(bl, json_pack("{sssssssi}", "name", b->name, "file", fn, "optim_file",
                                            opt ? fo : "", "params", b->nparams));
    }
    if (user_json) {
        json_error_t je;
        user = json_loads(user_json, 0, &je);
        if (!json_is_object(user)) {
            json_decref(wm), json_decref(bl), json_decref(user);
            return errprintf(err, "checkpoint %s: the caller's state is not a JSON object", name);
        }
    }
    int64_t step = 0, skipped = 0;
    if (opt)
        optim_counters(opt, &step, &skipped);
    json_t *index = json_pack("{s{sIss}so}", "metadata", "total_size", (json_int_t)total, "format",
                              "bmt", "weight_map", wm);
    json_t *ts =
        json_pack("{sssisssIsIs{sisisisisi}sosb}", "format", "bmt-checkpoint", "version", 1, "name",
                  name, "step", (json_int_t)step, "skipped", (json_int_t)skipped, "layout",
                  "groups", ctx->layout.groups, "gpus_per_group", ctx->layout.gpus_per_group,
                  "gpus_per_node", ctx->layout.gpus_per_node, "nodes", ctx->layout.nodes, "world",
                  ctx->layout.world, "blocks", bl, "optimizer", opt != NULL);
    if (user)
        json_object_set_new(ts, "user", user);
    char *it = json_dumps(index, JSON_INDENT(1) | JSON_SORT_KEYS);
    char *tt = json_dumps(ts, JSON_INDENT(1));
    json_decref(index);
    json_decref(ts);
    char path[4200], final[4200];
    int rc = it && tt ? 0 : errprintf(err, "out of memory");
    if (rc == 0) {
        snprintf(path, sizeof(path), "%.4000s/model.safetensors.index.json", tmpdir);
        rc = write_small(path, it, err);
    }
    if (rc == 0) {
        snprintf(path, sizeof(path), "%.4000s/train_state.json", tmpdir);
        rc = write_small(path, tt, err);
    }
    free(it);
    free(tt);
    snprintf(final, sizeof(final), "%s/%s", dir, name);
    if (rc == 0 && fsync_path(tmpdir) != 0)
        rc = errprintf(err, "cannot fsync %s: %s", tmpdir, strerror(errno));
    /* Re-saving a name replaces it; if DIR/latest named it, latest briefly
     * names nothing (load then says so) rather than something half-written. */
    if (rc == 0 && remove_tree(final) != 0)
        rc = errprintf(err, "cannot replace %s: %s", final, strerror(errno));
    if (rc == 0 && rename(tmpdir, final) != 0)
        rc = errprintf(err, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
    if (rc == 0 && fsync_path(dir) != 0)
        rc = errprintf(err, "cannot fsync %s: %s", dir, strerror(errno));
    if (rc == 0) {
        char text[300];
        snprintf(text, sizeof(text), "%s\n", name);
        snprintf(path, sizeof(path), "%s/latest", dir);
        rc = write_small(path, text, err);
        if (rc == 0 && fsync_path(dir) != 0)
            rc = errprintf(err, "cannot fsync %s: %s", dir, strerror(errno));
    }
    if (rc == 0 && keep > 0)
        prune(dir, name, keep);
    return rc;
}

static int save_start(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                      const char *user_json, int keep, bool copy, bmt_ckpt_pending_t **out,
                      bmt_error_t *err);

int bmt_ckpt_save_async(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                        const char *user_json, int keep, bmt_ckpt_pending_t **out, bmt_error_t *err)
{
    return save_start(list, opt, dir, name, user_json, keep, true, out, err);
}

/* copy: stage host copies of the shards (async); else, on cpu, write from them. */
static int save_start(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                      const char *user_json, int keep, bool copy, bmt_ckpt_pending_t **out,
                      bmt_error_t *err)
{
    *out = NULL;
    if (list == NULL || dir == NULL || *dir == '\0')
        return errprintf(err, "bmt_ckpt_save: a block list and a directory are required");
    bmt_ctx_t *ctx = blocklist_ctx(list);
    if (strlen(dir) > 3000)
        return errprintf(err, "rank %d: checkpoint directory name too long", ctx->rank);
    if (!good_name(name))
        return errprintf(err,
                         "rank %d: checkpoint name '%.60s': use letters, digits, '.', '-' and "
                         "'_' (not starting with '.')",
                         ctx->rank, name ? name : "(null)");
    if (opt && optim_list(opt) != list)
        return errprintf(err, "rank %d: bmt_ckpt_save: the optimizer is not this list's",
                         ctx->rank);
    const struct list_state *st = blocklist_state(list);
    if (st->forward_pending || st->microbatches > 0)
        return errprintf(err,
                         "rank %d: bmt_ckpt_save between a forward or backward and the "
                         "optimizer step: save after bmt_optim_step",
                         ctx->rank);
    bmt_ckpt_pending_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (user_json && (p->user_json = strdup(user_json)) == NULL) ||
        (p->nb = unique_blocks(list, &p->blocks)) < 0) {
        if (p)
            pending_free(p);
        return errprintf(err, "rank %d: out of memory", ctx->rank);
    }
    p->ctx = ctx;
    p->opt = opt;
    p->keep = keep;
    p->copy = copy || bmt_device(ctx) != BMT_DEVICE_CPU;
    if (opt) {
        int64_t skipped;
        optim_counters(opt, &p->step, &skipped);
    }
    snprintf(p->dir, sizeof(p->dir), "%s", dir);
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->tmpdir, sizeof(p->tmpdir), "%s/.tmp-%s", dir, name);
    int failed = 0;
    /* 1. rank 0: a fresh temporary directory with every file preallocated.
     * The optimizer's deferred update goes first: the state saved is the
     * step's. */
    if (blocklist_flush(list, NULL, true, err) < 0 || bmt_device_synchronize(ctx, err) < 0)
        failed = 1;
    if (!failed && ctx->rank == 0) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            errprintf(err, "cannot create %s: %s", dir, strerror(errno));
            failed = 1;
        } else if (remove_tree(p->tmpdir) != 0 || mkdir(p->tmpdir, 0755) != 0) {
            errprintf(err, "cannot create %s: %s", p->tmpdir, strerror(errno));
            failed = 1;
        }
        for (int i = 0; i < p->nb && !failed; i++)
            for (int k = 0; k < (opt ? 2 : 1) && !failed; k++) {
                struct flayout f;
                char fname[1024], path[4200];
                file_name(p->blocks[i], k == 1, fname, sizeof(fname));
                snprintf(path, sizeof(path), "%.3000s/%.1000s", p->tmpdir, fname);
                failed = flayout_make(p->blocks[i], k == 1, &f, err) < 0 ||
                         create_file(path, &f, err) < 0;
                flayout_free(&f);
            }
    }
    int rc = agree(ctx, failed, "preparing the checkpoint", err);
    /* 2. group 0 copies its shards to the host and hands them to a writer
     *    thread; the other groups hold the same shards and write nothing. */
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
        if (ctx->rank == 0)
            remove_tree(p->tmpdir);
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
            *err = p->err;
            failed = 1;
        }
    }
    int rc = agree(ctx, failed, "writing the checkpoint", err);
    if (rc == 0) {
        failed = ctx->rank == 0 && finish(ctx, p->blocks, p->nb, p->opt, p->dir, p->tmpdir, p->name,
                                          p->user_json, p->keep, err) < 0;
        rc = agree(ctx, failed, "completing the checkpoint", err);
    }
    if (rc < 0 && ctx->rank == 0)
        remove_tree(p->tmpdir);
    char where[3400];
    snprintf(where, sizeof(where), "%.3000s/%.250s", p->dir, p->name);
    pending_free(p);
    return rc < 0 ? errprefix(err, "checkpoint %s: ", where) : 0;
}

int bmt_ckpt_save(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir, const char *name,
                  const char *user_json, int keep, bmt_error_t *err)
{
    bmt_ckpt_pending_t *p;
    if (save_start(list, opt, dir, name, user_json, keep, false, &p, err) < 0)
        return -1;
    return bmt_ckpt_finish(p, err);
}

/* ------------------------------------------------------------ load */

int bmt_ckpt_resolve(const char *path, char *out, size_t len, bmt_error_t *err)
{
    if (path == NULL || strlen(path) > 3000)
        return errprintf(err, "bmt_ckpt_resolve: no path, or one too long");
    char p[4200];
    struct stat st;
    snprintf(p, sizeof(p), "%s/train_state.json", path);
    if (stat(p, &st) == 0) {
        snprintf(out, len, "%s", path);
        return 0;
    }
    snprintf(p, sizeof(p), "%s/latest", path);
    FILE *f = fopen(p, "r");
    if (f == NULL) {
        if (errno == ENOENT)
            return 1;
        return errprintf(err, "cannot read %s: %s", p, strerror(errno));
    }
    char name[300] = "";
    char *got = fgets(name, sizeof(name), f);
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    if (got == NULL || !good_name(name))
        return errprintf(err, "%s does not name a checkpoint ('%.60s')", p, name);
    snprintf(out, len, "%s/%s", path, name);
    snprintf(p, sizeof(p), "%s/train_state.json", out);
    if (stat(p, &st) != 0)
        return errprintf(err, "%s/latest names %s, which has no train_state.json", path, out);
    return 0;
}

struct src {
    bmt_st_t *st;
    int *idx; /* (nparams) tensor per parameter */
};

static int read_piece(void *user, const bmt_block_t *b, int param, int64_t first, int64_t count,
                      void *dst, bmt_dtype_t dtype, bmt_error_t *err)
{
    (void)b;
    const struct src *s = user;
    return bmt_st_read(s->st, s->idx[param], first, count, dst, dtype, err);
}

/* Tensor `name` of st with the parameter's shape and a float dtype: its index. */
static int expect(const bmt_st_t *st, const char *file, const struct param *p, const char *name,
                  bmt_error_t *err)
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
    if (t->dtype != BMT_ST_F32 && t->dtype != BMT_ST_BF16 && t->dtype != BMT_ST_F16 &&
        t->dtype != BMT_ST_F64)
        return errprintf(err, "%s: tensor '%s' is %s, not a float type", file, name,
                         bmt_st_dtype_name(t->dtype));
    return i;
}

/* Read this rank's pieces of the optimizer tensors of one dtype group into the
 * device shards (f32). */
static int load_state(bmt_ctx_t *ctx, const bmt_block_t *b, const optim_view_t *ov, bmt_st_t *st,
                      int *const idx[4], bmt_error_t *err)
{
    const struct dgroup *d = ov->d;
    float *dst[4] = { NULL, ov->m, ov->v, d->dtype == BMT_F32 ? NULL : ov->master };
    int rc = 0;
    for (int k = T_EXP_AVG; k <= T_MASTER && rc == 0; k++) {
        if (dst[k] == NULL)
            continue;
        /* On cpu straight into the state (names and shapes are checked already);
         * else through a host buffer of zeros (gaps and padding stay zero). */
        const bool direct = bmt_device(ctx) == BMT_DEVICE_CPU;
        float *h = direct ? dst[k] : calloc(d->shard + 1, sizeof(float));
        if (h == NULL)
            return errprintf(err, "out of memory");
        for (int j = 0; j < b->nparams && rc == 0; j++) {
            const struct param *p = &b->params[j];
            if (&b->groups[p->group] != d)
                continue;
            size_t lo, hi;
            if (block_in_shard(p, d, &lo, &hi))
                rc = bmt_st_read(st, idx[k][j], (int64_t)(lo - p->offset), (int64_t)(hi - lo),
                                 h + (lo - d->shard_first), BMT_F32, err);
        }
        if (rc == 0 && !direct)
            rc = bmt_mem_upload(ctx, dst[k], h, d->shard * sizeof(float), err);
        if (!direct)
            free(h);
    }
    return rc;
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
    snprintf(p, sizeof(p), "%s/train_state.json", dir);
    json_error_t je;
    json_t *ts = json_load_file(p, 0, &je);
    json_t *jstep = ts ? json_object_get(ts, "step") : NULL;
    json_t *jskip = ts ? json_object_get(ts, "skipped") : NULL;
    json_t *jopt = ts ? json_object_get(ts, "optimizer") : NULL;
    if (!json_is_object(ts) || !json_is_integer(jstep) || !json_is_integer(jskip)) {
        json_decref(ts);
        return errprintf(err, "%s: not a bmt checkpoint state (%s)", p,
                         ts ? "step or skipped missing" : je.text);
    }
    if (opt && !json_is_true(jopt)) {
        json_decref(ts);
        return errprintf(err, "%s was saved without optimizer state", dir);
    }
    bmt_block_t **blocks = NULL;
    int nb = unique_blocks(list, &blocks), rc = nb < 0 ? errprintf(err, "out of memory") : 0;
    bmt_st_t **sts = calloc((size_t)(2 * (nb > 0 ? nb : 1)), sizeof(*sts));
    int **idx = calloc((size_t)(8 * (nb > 0 ? nb : 1)), sizeof(*idx));
    if (rc == 0 && (sts == NULL || idx == NULL))
        rc = errprintf(err, "out of memory");
    /* Every file, name, shape and dtype first: a mismatch loads nothing. */
    for (int i = 0; i < nb && rc == 0; i++) {
        const bmt_block_t *b = blocks[i];
        for (int f = 0; f < (opt ? 2 : 1) && rc == 0; f++) {
            char fname[1024];
            file_name(b, f == 1, fname, sizeof(fname));
            snprintf(p, sizeof(p), "%.3000s/%.1000s", dir, fname);
            if ((sts[2 * i + f] = bmt_st_open(p, err)) == NULL) {
                rc = -1;
                break;
            }
            for (int k = f ? T_EXP_AVG : T_PARAM; k <= (f ? T_MASTER : T_PARAM) && rc == 0; k++) {
                int *ix = idx[8 * i + k] = calloc((size_t)b->nparams + 1, sizeof(int));
                if (ix == NULL)
                    rc = errprintf(err, "out of memory");
                for (int j = 0; j < b->nparams && rc == 0; j++) {
                    char tn[1100];
                    if (k == T_MASTER && b->params[j].dtype == BMT_F32)
                        continue;
                    snprintf(tn, sizeof(tn), "%s%s", b->params[j].name, suffix[k]);
                    if ((ix[j] = expect(sts[2 * i + f], p, &b->params[j], tn, err)) < 0)
                        rc = -1;
                }
            }
        }
    }
    /* A group whose values live in a master_only optimizer loads through it. */
    for (int i = 0; i < nb && rc == 0; i++)
        for (int g = 0; g < blocks[i]->ngroups && rc == 0; g++)
            if (blocks[i]->groups[g].param == NULL && opt == NULL)
                rc = errprintf(err,
                               "block %.40s keeps its parameters in its optimizer (master_only): "
                               "pass that optimizer to bmt_ckpt_load",
                               blocks[i]->name);
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
    json_decref(ts);
    if (rc == 0 && bmt_device_synchronize(ctx, err) < 0)
        rc = -1;
    return rc < 0 ? errprefix(err, "rank %d: loading %s: ", ctx->rank, dir) : 0;
}
