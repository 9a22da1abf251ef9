/* runtime/init.c — bmt_init and bmt_finalize: from a process to a rank of a job.
 *
 * Order: PMIx (boot.c) -> layout -> device -> backend -> plugins -> the ranks
 * compare their settings with rank 0's (boot_agree) -> world communicator ->
 * group and replica communicators split from it. The layout comes from the job
 * keys the launcher registered with PMIx (bmt.groups, bmt.gpus_per_group,
 * bmt.gpus_per_node); under srun, where only Slurm's keys exist, from the BMT_
 * environment that bmlaunch sets; with neither, the job is one group of all its
 * ranks. When both sources exist they must agree: a program must never run with
 * a layout other than the one its launcher planned. Each rank derives it alone,
 * so the ranks then compare it (and the device, the backend and
 * BMT_CHECK_COLLECTIVES) before any communicator exists.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bmt/bmt.h"
#include "ctx.h"
#include "env.h"
#include "monitor.h"
#include "error.h"
#include "fault.h"
#include "hash.h"

#ifdef BMT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* One layout number: from PMIx if the launcher registered it, else from the
 * environment. Returns 1 found, 0 absent, -1 error (both present and differing,
 * or malformed). */
static int layout_number(bmt_ctx_t *ctx, const char *pmix_key, const char *env_name, int *out,
                         bmt_error_t *err)
{
    uint32_t p = 0;
    int from_pmix = boot_job_uint(ctx->boot, pmix_key, &p, err);
    if (from_pmix < 0)
        return -1;
    int e = 0;
    int from_env = env_get_positive(env_name, &e, err);
    if (from_env < 0)
        return errprefix(err, "rank %d: ", ctx->rank);
    if (from_pmix && from_env && (int)p != e)
        return errprintf(err,
                         "rank %d: the launcher registered %s=%u but the environment says "
                         "%s=%d; unset %s or start the job with matching options",
                         ctx->rank, pmix_key, p, env_name, e, env_name);
    if (from_pmix) {
        *out = (int)p;
        return 1;
    }
    if (from_env) {
        *out = e;
        return 1;
    }
    return 0;
}

static int setup_layout(bmt_ctx_t *ctx, bmt_error_t *err)
{
    const boot_info_t *bi = boot_info(ctx->boot);
    int groups = 1, gpg = bi->size, gpn = 0;
    int hg, hp, hn;
    if ((hg = layout_number(ctx, "bmt.groups", "BMT_GROUPS", &groups, err)) < 0 ||
        (hp = layout_number(ctx, "bmt.gpus_per_group", "BMT_GPUS_PER_GROUP", &gpg, err)) < 0 ||
        (hn = layout_number(ctx, "bmt.gpus_per_node", "BMT_GPUS_PER_NODE", &gpn, err)) < 0)
        return -1;
    /* One of the two given: the other from the job's size, which it must divide. */
    if (hg != hp && bi->size % (hg ? groups : gpg) != 0)
        return errprintf(err,
                         "rank %d: %s=%d does not divide the job's %d ranks; start it with "
                         "bmlaunch or set BMT_GROUPS/BMT_GPUS_PER_GROUP to fit",
                         ctx->rank, hg ? "BMT_GROUPS" : "BMT_GPUS_PER_GROUP", hg ? groups : gpg,
                         bi->size);
    if (hg && !hp)
        gpg = bi->size / groups;
    if (hp && !hg)
        groups = bi->size / gpg;
    if (!hn)
        gpn = (bi->local_size > 0 && bi->size % bi->local_size == 0) ? bi->local_size : 0;
    bmt_error_t lerr;
    if (bmt_layout_make(&ctx->layout, groups, gpg, gpn, 0, &lerr) < 0)
        return errprintf(err, "rank %d: layout: %s", ctx->rank, lerr.text);
    if (ctx->layout.world != bi->size)
        return errprintf(err,
                         "rank %d: the layout %d x %d = %d ranks does not match the job's %d "
                         "ranks; start it with bmlaunch or set BMT_GROUPS/BMT_GPUS_PER_GROUP",
                         ctx->rank, groups, gpg, ctx->layout.world, bi->size);
    ctx->self = bmt_layout_rank(&ctx->layout, ctx->rank);
    return 0;
}

static int setup_device(bmt_ctx_t *ctx, const char *device, bmt_error_t *err)
{
    if (strcmp(device, "cpu") == 0) {
        ctx->device = BMT_DEVICE_CPU;
        ctx->device_index = -1;
        return 0;
    }
    if (strcmp(device, "cuda") != 0)
        return errprintf(err, "rank %d: unknown device '%.900s' (BMT_DEVICE): use cpu or cuda",
                         ctx->rank, device);
    /* The layout picks the GPU (cuda:<local rank>); it holds only where the
     * launcher placed the ranks node by node in rank order, as many per node as
     * the layout says. Otherwise two ranks of a node could take one GPU. On cpu
     * the layout's nodes may be logical (several on one machine): no check. */
    const boot_info_t *bi = boot_info(ctx->boot);
    if (!bi->singleton && bi->local_rank != ctx->self.local_rank)
        return errprintf(err,
                         "rank %d: PMIx places it as local rank %d of %d on %s, but the layout "
                         "(%d ranks per node) makes it local rank %d and would give it cuda:%d; "
                         "start the ranks node by node in rank order (srun --distribution=block) "
                         "with BMT_GPUS_PER_NODE equal to the ranks per node",
                         ctx->rank, bi->local_rank, bi->local_size, bi->hostname,
                         ctx->layout.gpus_per_node, ctx->self.local_rank, ctx->self.local_rank);
#ifdef BMT_HAVE_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return errprintf(err, "rank %d: cudaGetDeviceCount: %s", ctx->rank, cudaGetErrorString(e));
    if (ctx->self.local_rank >= n)
        return errprintf(err,
                         "rank %d: local rank %d needs cuda:%d but this node shows %d GPU%s; "
                         "lower --gpus-per-node or check CUDA_VISIBLE_DEVICES",
                         ctx->rank, ctx->self.local_rank, ctx->self.local_rank, n,
                         n == 1 ? "" : "s");
    e = cudaSetDevice(ctx->self.local_rank);
    if (e != cudaSuccess)
        return errprintf(err, "rank %d: cudaSetDevice(%d): %s", ctx->rank, ctx->self.local_rank,
                         cudaGetErrorString(e));
    ctx->device = BMT_DEVICE_CUDA;
    ctx->device_index = ctx->self.local_rank;
    return 0;
#else
    return errprintf(err, "rank %d: device cuda requested but this libbmt was built without CUDA",
                     ctx->rank);
#endif
}

static int setup_backend(bmt_ctx_t *ctx, const char *name, bmt_error_t *err)
{
    if (name == NULL)
        name = ctx->device == BMT_DEVICE_CUDA ? "nccl" : "shm";
    ctx->backend = comm_backend_find(name);
    if (ctx->backend == NULL) {
#ifdef BMT_HAVE_NCCL
        const char *known = "shm, nccl or none";
#else
        const char *known = "shm or none (this libbmt was built without NCCL)";
#endif
        return errprintf(err,
                         "rank %d: unknown communication backend '%.900s' (BMT_BACKEND): use %s",
                         ctx->rank, name, known);
    }
    if (ctx->backend == &comm_backend_shm) {
        if (ctx->device != BMT_DEVICE_CPU)
            return errprintf(err,
                             "rank %d: the shm backend moves host memory; use device cpu, "
                             "or the nccl backend on cuda",
                             ctx->rank);
        const boot_info_t *bi = boot_info(ctx->boot);
        if (bi->local_size != bi->size)
            return errprintf(err,
                             "rank %d: the shm backend needs every rank on one node, but only %d "
                             "of %d are on %s; use the nccl backend across nodes",
                             ctx->rank, bi->local_size, bi->size, bi->hostname);
    }
#ifdef BMT_HAVE_NCCL
    if (ctx->backend == &comm_backend_nccl && ctx->device != BMT_DEVICE_CUDA)
        return errprintf(err, "rank %d: the nccl backend needs device cuda (BMT_DEVICE=cuda)",
                         ctx->rank);
#endif
    return 0;
}

/* The layout's two splits of the world, without exchanging anything: every rank
 * computes every other rank's color and key from the layout. */
static int setup_splits(bmt_ctx_t *ctx, bmt_error_t *err)
{
    const bmt_layout_t *l = &ctx->layout;
    int *colors = malloc(sizeof(int) * (size_t)l->world);
    int *keys = malloc(sizeof(int) * (size_t)l->world);
    int rc = -1;
    if (colors == NULL || keys == NULL) {
        errprintf(err, "rank %d: out of memory building the group communicators", ctx->rank);
        goto out;
    }
    char name[48];
    for (int r = 0; r < l->world; r++) {
        bmt_rank_info_t ri = bmt_layout_rank(l, r);
        colors[r] = ri.group;
        keys[r] = ri.group_rank;
    }
    snprintf(name, sizeof(name), "group %d", ctx->self.group);
    if (comm_split_known(ctx->world_comm, colors, keys, name, &ctx->group_comm, err) < 0)
        goto out;
    ctx->group_comm->owned = true;
    for (int r = 0; r < l->world; r++) {
        bmt_rank_info_t ri = bmt_layout_rank(l, r);
        colors[r] = ri.group_rank;
        keys[r] = ri.group;
    }
    snprintf(name, sizeof(name), "replica %d", ctx->self.group_rank);
    if (comm_split_known(ctx->world_comm, colors, keys, name, &ctx->replica_comm, err) < 0)
        goto out;
    ctx->replica_comm->owned = true;
    rc = 0;
out:
    free(colors);
    free(keys);
    return rc;
}

/* What every rank must have alike: the layout (each rank derives it from its own
 * environment and PMIx's view of its node), the device and backend, and the
 * collective check (a rank that checks pairs its descriptor exchange with a
 * peer's real collective: with nccl, data into the wrong buffers). */
typedef struct agreed {
    int32_t groups, gpus_per_group, gpus_per_node;
    int32_t device;            /* bmt_device_kind_t */
    int32_t check_collectives; /* BMT_CHECK_COLLECTIVES */
    char backend[12];          /* its name, NUL-terminated */
} agreed_t;
_Static_assert(sizeof(agreed_t) == 32, "agreed_t travels as bytes: no padding");

static const char *device_word(int32_t d) { return d == BMT_DEVICE_CUDA ? "cuda" : "cpu"; }

/* Every rank compares its settings with rank 0's (boot_agree: two PMIx fences,
 * O(world) gets). All ranks reach the same verdict and fail alike, naming the
 * lowest rank that differs and how, as the collective check does. */
static int setup_agree(bmt_ctx_t *ctx, bmt_error_t *err)
{
    agreed_t mine, zero, other;
    memset(&mine, 0, sizeof(mine));
    mine.groups = ctx->layout.groups;
    mine.gpus_per_group = ctx->layout.gpus_per_group;
    mine.gpus_per_node = ctx->layout.gpus_per_node;
    mine.device = (int32_t)ctx->device;
    mine.check_collectives = ctx->check_collectives;
    snprintf(mine.backend, sizeof(mine.backend), "%s", ctx->backend->name);
    int r = -1;
    if (boot_agree(ctx->boot, &mine, sizeof(mine), &r, &zero, &other, err) < 0)
        return -1;
    if (r < 0)
        return 0;
    zero.backend[sizeof(zero.backend) - 1] = '\0';
    other.backend[sizeof(other.backend) - 1] = '\0';
    if (other.groups != zero.groups || other.gpus_per_group != zero.gpus_per_group ||
        other.gpus_per_node != zero.gpus_per_node)
        return errprintf(err,
                         "rank %d: the ranks disagree on the layout: rank %d's is %d x %d with %d "
                         "ranks per node, rank 0's %d x %d with %d; give every rank the same "
                         "BMT_GROUPS, BMT_GPUS_PER_GROUP and BMT_GPUS_PER_NODE (unset, the ranks "
                         "per node come from PMIx's local size, which differs between nodes)",
                         ctx->rank, r, other.groups, other.gpus_per_group, other.gpus_per_node,
                         zero.groups, zero.gpus_per_group, zero.gpus_per_node);
    if (other.device != zero.device)
        return errprintf(err,
                         "rank %d: the ranks disagree on the device: rank %d uses %s, rank 0 %s; "
                         "set BMT_DEVICE (or bmt_config_t.device) alike on every rank",
                         ctx->rank, r, device_word(other.device), device_word(zero.device));
    if (strcmp(other.backend, zero.backend) != 0)
        return errprintf(err,
                         "rank %d: the ranks disagree on the backend: rank %d uses %s, rank 0 "
                         "%s; set BMT_BACKEND (or bmt_config_t.backend) alike on every rank",
                         ctx->rank, r, other.backend, zero.backend);
    return errprintf(err,
                     "rank %d: the ranks disagree on BMT_CHECK_COLLECTIVES: rank %d has %d, "
                     "rank 0 %d; set it alike on every rank",
                     ctx->rank, r, (int)other.check_collectives, (int)zero.check_collectives);
}

/* BMT_PENDING_SIGNALS (bmlaunch sets it in a restarted job's ranks): the
 * SIGUSR1 and SIGUSR2 that came before this run, as bits (bit N: signal N).
 * 0, or -1 with err for anything but USR1, USR2 or both, comma-separated. */
static int pending_signals(unsigned *bits, bmt_error_t *err)
{
    const char *v = env_get("BMT_PENDING_SIGNALS");
    *bits = 0;
    if (v == NULL)
        return 0;
    const char *p = v;
    if (*p == '\0')
        return errprintf(err, "BMT_PENDING_SIGNALS is set but empty: unset it (bmlaunch sets it)");
    while (*p) {
        size_t n = strcspn(p, ",");
        int sig = n == 4 && strncmp(p, "USR1", 4) == 0   ? SIGUSR1
                  : n == 4 && strncmp(p, "USR2", 4) == 0 ? SIGUSR2
                                                         : 0;
        if (sig == 0 || (*bits & 1u << sig) || (p[n] == ',' && p[n + 1] == '\0'))
            return errprintf(err,
                             "BMT_PENDING_SIGNALS='%.900s' is not USR1, USR2 or USR1,USR2 "
                             "(bmlaunch sets it)",
                             v);
        *bits |= 1u << sig;
        p += n + (p[n] == ',');
    }
    return 0;
}

int bmt_init(bmt_ctx_t **out, const bmt_config_t *cfg, bmt_error_t *err)
{
    bmt_config_t defaults = BMT_CONFIG_INITIALIZER;
    if (out == NULL)
        return errprintf(err, "bmt_init: out must not be NULL");
    if (cfg == NULL)
        cfg = &defaults;
    if (cfg->magic != BMT_CONFIG_MAGIC || cfg->size < sizeof(bmt_config_t) ||
        cfg->version != BMT_CONFIG_VERSION)
        return errprintf(err,
                         "bmt_init: the config was not set up with BMT_CONFIG_INITIALIZER "
                         "of this version of bmt.h (%s)",
                         BMT_VERSION_STRING);
    if (!(cfg->timeout_s >= 0) || cfg->timeout_s > 1e9) /* NaN too */
        return errprintf(err,
                         "bmt_init: timeout_s must be 0 (BMT_TIMEOUT, else 300) or a number of "
                         "seconds, not %g",
                         cfg->timeout_s);
    bmt_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return errprintf(err, "bmt_init: out of memory");
    ctx->device_index = -1;

    if (cfg->timeout_s > 0)
        ctx->timeout_s = cfg->timeout_s;
    else if (env_get_seconds("BMT_TIMEOUT", &ctx->timeout_s, err) < 0) {
        errprefix(err, "bmt_init: "); /* before PMIx: no rank to name yet */
        goto fail;
    }
    if (env_get_flag("BMT_CHECK_COLLECTIVES", &ctx->check_collectives, err) < 0) {
        errprefix(err, "bmt_init: ");
        goto fail;
    }
    unsigned pending;
    if (pending_signals(&pending, err) < 0) {
        errprefix(err, "bmt_init: ");
        goto fail;
    }
    /* NCCL reads its environment at its first call; set it now, before PMIx
     * starts threads (setenv is not thread-safe). See comm_nccl.c for why. */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    if (boot_init(&ctx->boot, ctx->timeout_s, err) < 0)
        goto fail;
    const boot_info_t *bi = boot_info(ctx->boot);
    ctx->rank = bi->rank;
    ctx->world = bi->size;
    ctx->job_hash = job_hash_of(bi->nspace, (uint64_t)getuid());

    if (setup_layout(ctx, err) < 0)
        goto fail;
    if (setup_device(ctx, cfg->device ? cfg->device : env_get("BMT_DEVICE"), err) < 0)
        goto fail;
    if (setup_backend(ctx, cfg->backend ? cfg->backend : env_get("BMT_BACKEND"), err) < 0 ||
        device_setup_streams(ctx, err) < 0)
        goto fail;
    /* Plugins before the communicators: a misconfigured plugin fails in
     * milliseconds, not after NCCL's set-up. */
    if (monitor_init(ctx, err) < 0 || fault_init(ctx, err) < 0 || setup_agree(ctx, err) < 0)
        goto fail;
    ctx->world_comm = comm_create_world(ctx, ctx->backend, err);
    if (ctx->world_comm == NULL)
        goto fail;
    ctx->world_comm->owned = true;
    if (setup_splits(ctx, err) < 0)
        goto fail;
    *out = ctx;
    /* A restarted job's warning (Slurm's SIGUSR1 before the time limit, say)
     * came to bmlaunch before this run: deliver it now, when the program is
     * ready for it, as if bmlaunch had forwarded it. Its handler (installed
     * before bmt_init, as the trainers do) runs in this thread, or its default
     * action ends the process, as a forwarded one's would. */
    if (pending & 1u << SIGUSR1)
        raise(SIGUSR1);
    if (pending & 1u << SIGUSR2)
        raise(SIGUSR2);
    return 0;
fail:
    ctx->comm_failed = true; /* tear down without waiting for peers */
    (void)bmt_finalize(ctx); /* err already says why */
    return -1;
}

int bmt_finalize(bmt_ctx_t *ctx)
{
    if (ctx == NULL)
        return 0;
    if (ctx->live_lists > 0 || ctx->live_optims > 0) {
        /* Their destroy uses the streams, memory and communicators that
         * finalizing frees: leave everything as it is, so that they can still
         * be destroyed (and bmt_finalize called again then). */
        fprintf(stderr,
                "bmt: rank %d: bmt_finalize: %d block list(s) and %d optimizer(s) not "
                "destroyed: destroy them first; nothing was finalized\n",
                ctx->rank, ctx->live_lists, ctx->live_optims);
        return -1;
    }
    int rc = monitor_finalize(ctx);
    /* Let enqueued work finish, bounded; if it cannot, abort rather than flush. */
    bmt_error_t serr;
    if (ctx->device == BMT_DEVICE_CUDA && !ctx->comm_failed &&
        bmt_device_synchronize(ctx, &serr) < 0) {
        fprintf(stderr, "bmt: rank %d: bmt_finalize: the device's queued work did not finish: %s\n",
                ctx->rank, serr.text);
        ctx->comm_failed = true;
        rc = -1;
    }
    comm_free(ctx->replica_comm);
    comm_free(ctx->group_comm);
    comm_free(ctx->world_comm);
    device_release(ctx);
    boot_finalize(ctx->boot);
    free(ctx);
    return rc;
}

void bmt_abort(bmt_ctx_t *ctx, int status, const char *msg)
{
    if (ctx == NULL)
        return;
    /* Said on stderr too: under srun the launcher learns of the abort only from
     * the rank's output (bmlaunch reads this line). */
    fprintf(stderr, "bmt: rank %d called bmt_abort(status %d): %s\n", ctx->rank, status,
            msg ? msg : "");
    fflush(stderr);
    monitor_abort(ctx, status, msg); /* the plugins tell the collector, within their flush time */
    boot_abort(ctx->boot, status, msg);
}

int bmt_oob_allgather(bmt_ctx_t *ctx, const void *mine, size_t len, void *all, bmt_error_t *err)
{
    if (ctx == NULL || (len && (mine == NULL || all == NULL)))
        return errprintf(err, "bmt_oob_allgather: NULL argument");
    return boot_allgather(ctx->boot, mine, len, all, err);
}

int bmt_oob_publish(bmt_ctx_t *ctx, const void *mine, size_t len, bmt_error_t *err)
{
    if (ctx == NULL || len == 0 || mine == NULL)
        return errprintf(err, "bmt_oob_publish: NULL argument or empty data");
    return boot_publish(ctx->boot, mine, len, err);
}

int bmt_oob_fetch(bmt_ctx_t *ctx, int peer, void *buf, size_t len, bmt_error_t *err)
{
    if (ctx == NULL || buf == NULL)
        return errprintf(err, "bmt_oob_fetch: NULL argument");
    return boot_fetch(ctx->boot, peer, buf, len, err);
}

int bmt_rank(const bmt_ctx_t *ctx) { return ctx->rank; }
int bmt_world_size(const bmt_ctx_t *ctx) { return ctx->world; }
const bmt_layout_t *bmt_layout(const bmt_ctx_t *ctx) { return &ctx->layout; }
bmt_rank_info_t bmt_self(const bmt_ctx_t *ctx) { return ctx->self; }
bmt_device_kind_t bmt_device(const bmt_ctx_t *ctx) { return ctx->device; }
int bmt_device_index(const bmt_ctx_t *ctx) { return ctx->device_index; }
const char *bmt_backend(const bmt_ctx_t *ctx) { return ctx->backend->name; }
const char *bmt_hostname(const bmt_ctx_t *ctx) { return boot_info(ctx->boot)->hostname; }
double bmt_timeout(const bmt_ctx_t *ctx) { return ctx->timeout_s; }
bmt_comm_t *bmt_comm_world(bmt_ctx_t *ctx) { return ctx->world_comm; }
bmt_comm_t *bmt_comm_group(bmt_ctx_t *ctx) { return ctx->group_comm; }
bmt_comm_t *bmt_comm_replica(bmt_ctx_t *ctx) { return ctx->replica_comm; }
