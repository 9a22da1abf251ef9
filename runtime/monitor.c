/* runtime/monitor.c — per-step metrics, computed once, handed to monitor plugins.
 *
 * bmt_init loads the plugins of BMT_PLUGINS with dlopen (bmt/plugin.h) and
 * calls their init with the job's facts. bmt_report_step then measures the step
 * on this rank — wall time since the previous report, exposed communication
 * (device.c on cuda, comm.c's host time in collectives on cpu), memory per kind
 * with the step's peak — turns the program's counts into rates, FLOP/s and MFU,
 * and calls every plugin's on_step. Plugins run on the training thread and must
 * not block (their I/O runs on their own threads); the time spent in their
 * callbacks is measured and reported as the next step's plugin_s, so a plugin
 * that does block shows up in its own numbers.
 *
 * A plugin that cannot be loaded (missing file, missing symbol, another ABI
 * version, an init that fails) fails bmt_init, or with BMT_PLUGIN_ERRORS=warn
 * is reported on stderr and left out. Loaded plugins stay mapped until the
 * process exits: a plugin's library (libcurl, ...) may keep thread-local state
 * or atexit handlers that must not point into unmapped code.
 *
 * A plugin that loses what it was handed later on (jsonl: its disk is full)
 * calls job->fail from its own thread; from then on every bmt_report_* fails
 * with its message (unless BMT_PLUGIN_ERRORS=warn), so the program ends
 * non-zero rather than exiting 0 with its metrics half-written.
 */
#include "monitor.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctx.h"
#include "device.h"
#include "env.h"
#include "error.h"

#ifndef BMT_DEFAULT_PLUGIN_DIR
#define BMT_DEFAULT_PLUGIN_DIR "/usr/local/lib/bmt/plugins"
#endif

#define MAX_PLUGINS 16

struct plugin {
    const bmt_monitor_plugin_v1_t *api;
    void *state;
    char name[4096]; /* as BMT_PLUGINS named it (load_one refuses longer ones) */
};

struct monitor {
    struct plugin p[MAX_PLUGINS];
    int n;
    bmt_job_info_t job;
    char job_id[256];
    char device_name[128];
    const char *kind_names[BMT_METRICS_MEM_KINDS];
    double peak_flops;
    double step_start; /* monotonic seconds: start of the step being timed */
    double comm_mark;  /* ctx->comm_host_s at step_start */
    double plugin_acc; /* seconds in plugin callbacks since the last report */
    int64_t reports;
    int64_t last_step;
    int64_t tokens_total, samples_total;
    char scalars[BMT_SCALARS_MAX][BMT_SCALAR_NAME_MAX + 1]; /* names reported so far */
    int nscalars;
    bool finalized;
    bool warn;          /* BMT_PLUGIN_ERRORS=warn */
    atomic_int failing; /* a plugin called job.fail (the first one writes fail_msg) */
    atomic_int failed;  /* fail_msg is written */
    char fail_msg[768];
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double unix_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ peak FLOP/s */

/* Dense bf16 tensor-core peaks from the vendors' data sheets (TFLOP/s). Names
 * match as whole words of the CUDA device name, most specific first, so "H20"
 * does not match "H200" and "L4" not "L40S". */
static const struct {
    const char *word;
    double tflops;
} peaks[] = {
    { "H200 NVL", 835 }, { "H100 NVL", 835 }, { "H100 PCIe", 756 }, { "GH200", 989 },
    { "H200", 989 },     { "H100", 989 },     { "H800", 989 },      { "H20", 148 },
    { "GB200", 2500 },   { "B200", 2250 },    { "B100", 1750 },     { "A100", 312 },
    { "A800", 312 },     { "L40S", 362 },     { "L40", 181 },       { "L4", 121 },
    { "A10", 125 },
};

static bool word_at(const char *hay, const char *p, size_t len)
{
    bool left = p == hay || !isalnum((unsigned char)p[-1]);
    bool right = !isalnum((unsigned char)p[len]);
    return left && right;
}

double bmt_peak_flops_of(const char *name)
{
    if (name == NULL)
        return 0;
    for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++) {
        size_t len = strlen(peaks[i].word);
        for (const char *p = strstr(name, peaks[i].word); p; p = strstr(p + 1, peaks[i].word))
            if (word_at(name, p, len))
                return peaks[i].tflops * 1e12;
    }
    return 0;
}

double bmt_peak_flops(const bmt_ctx_t *ctx)
{
    return ctx && ctx->monitor ? ctx->monitor->peak_flops : 0;
}

/* ------------------------------------------------------------ loading */

static void say(const bmt_ctx_t *ctx, const char *fmt, ...) BMT_PRINTF(2, 3);
static void say(const bmt_ctx_t *ctx, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "bmt: rank %d: %s\n", ctx->rank, line);
}

static bool valid_name(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.')
            return false;
    return true;
}

/* Load one plugin into m->p[m->n]. On failure writes the whole story to why. */
static int load_one(bmt_ctx_t *ctx, struct monitor *m, const char *item, char *why, size_t len)
{
    char path[4096];
    bool is_path = strchr(item, '/') != NULL;
    if (strlen(item) >= sizeof(m->p[0].name) - 8) /* room for BMT_PLUGIN_DIR's "/x.so" too */
        return snprintf(why, len, "plugin '%.200s...' in BMT_PLUGINS: %zu bytes, too long a path",
                        item, strlen(item)),
               -1;
    if (!is_path && !valid_name(item))
        return snprintf(why, len,
                        "plugin '%.200s' in BMT_PLUGINS: a name is letters, digits, '_', '-' "
                        "and '.' (or give a path containing '/')%s",
                        item, strpbrk(item, " \t") ? "; separate plugins with ','" : ""),
               -1;
    if (is_path)
        snprintf(path, sizeof(path), "%s", item);
    else {
        const char *dir = env_get("BMT_PLUGIN_DIR");
        snprintf(path, sizeof(path), "%s/%s.so", dir ? dir : BMT_DEFAULT_PLUGIN_DIR, item);
    }
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->p[i].name, item) == 0)
            return snprintf(why, len, "plugin %s is named twice in BMT_PLUGINS", item), -1;
    dlerror();
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL)
        return snprintf(why, len, "plugin %s: cannot load it: %s (check BMT_PLUGINS%s)", item,
                        dlerror(), is_path ? "" : " and BMT_PLUGIN_DIR"),
               -1;
    /* Name the plugin by what BMT_PLUGINS said, and by its file when that was a name. */
    char label[1024];
    if (is_path)
        snprintf(label, sizeof(label), "%.1000s", item);
    else
        snprintf(label, sizeof(label), "%.100s (%.900s)", item, path);
    const bmt_monitor_plugin_v1_t *api = dlsym(dl, BMT_PLUGIN_SYMBOL);
    if (api == NULL) {
        snprintf(
            why, len,
            "plugin %.900s has no symbol %s: not a bmt monitor plugin, or built for another ABI",
            label, BMT_PLUGIN_SYMBOL);
        dlclose(dl);
        return -1;
    }
    if (api->version != BMT_PLUGIN_ABI_VERSION) {
        snprintf(why, len,
                 "plugin %.900s has ABI version %u, this libbmt %s speaks version %u: rebuild the "
                 "plugin against its bmt/plugin.h",
                 label, api->version, BMT_VERSION_STRING, BMT_PLUGIN_ABI_VERSION);
        dlclose(dl);
        return -1;
    }
    if (api->size < BMT_PLUGIN_V1_MIN_SIZE || api->init == NULL || api->on_step == NULL ||
        api->finalize == NULL) {
        snprintf(why, len,
                 "plugin %.900s: its bmt_monitor_plugin_v1 is incomplete (size %u, need %u; init, "
                 "on_step and finalize are required)",
                 label, api->size, BMT_PLUGIN_V1_MIN_SIZE);
        dlclose(dl);
        return -1;
    }
    /* The same plugin twice (by name and by path, through a link, or a copy)
     * would get every step twice: a jsonl file with each line twice. */
    for (int i = 0; i < m->n; i++) {
        const bmt_monitor_plugin_v1_t *o = m->p[i].api;
        if (o == api || (o->name && api->name && strcmp(o->name, api->name) == 0)) {
            snprintf(why, len,
                     "plugin %.400s is plugin '%.60s' again, which BMT_PLUGINS named before as "
                     "%.400s: name each plugin once",
                     label, api->name ? api->name : "?", m->p[i].name);
            dlclose(dl);
            return -1;
        }
    }
    char perr[512] = "";
    void *state = NULL;
    if (api->init(&m->job, &state, perr, sizeof(perr)) != 0) {
        snprintf(why, len, "plugin %s: init failed: %s", item, perr[0] ? perr : "(no message)");
        /* init failed: nothing of it runs; its library stays mapped (see top) */
        return -1;
    }
    struct plugin *p = &m->p[m->n++];
    p->api = api;
    p->state = state;
    snprintf(p->name, sizeof(p->name), "%s", item);
    return 0;
}

static const char *knob(const char *name) { return env_get(name); }

/* job.fail: any thread of a plugin, any time between its init and the end of
 * its finalize (the monitor is freed after finalize_all). */
static void plugin_fail(const bmt_job_info_t *job, const char *msg)
{
    if (job == NULL)
        return;
    struct monitor *m = (struct monitor *)(void *)((char *)job - offsetof(struct monitor, job));
    int no = 0;
    if (!atomic_compare_exchange_strong(&m->failing, &no, 1))
        return; /* the first cause is the one to say */
    snprintf(m->fail_msg, sizeof(m->fail_msg), "%s", msg && *msg ? msg : "(no message)");
    atomic_store(&m->failed, 1);
}

/* -1 with err once a plugin failed (BMT_PLUGIN_ERRORS=fail): the metrics the
 * program hands on would not all arrive. */
static int check_plugins(const bmt_ctx_t *ctx, const struct monitor *m, const char *call,
                         bmt_error_t *err)
{
    if (m->warn || !atomic_load(&m->failed))
        return 0;
    return errprintf(err,
                     "rank %d: %s: a monitor plugin failed: %s (the job's metrics are "
                     "incomplete; fix the cause, or BMT_PLUGIN_ERRORS=warn runs on without them)",
                     ctx->rank, call, m->fail_msg);
}

int monitor_init(bmt_ctx_t *ctx, bmt_error_t *err)
{
    struct monitor *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return errprintf(err, "rank %d: out of memory", ctx->rank);
    const char *errors = env_get("BMT_PLUGIN_ERRORS");
    bool warn = strcmp(errors, "warn") == 0;
    m->warn = warn;
    if (!warn && strcmp(errors, "fail") != 0) {
        free(m);
        return errprintf(err, "rank %d: BMT_PLUGIN_ERRORS='%.900s': use fail or warn", ctx->rank,
                         errors);
    }
    double flush_s;
    if (env_get_seconds("BMT_PLUGIN_FLUSH_TIMEOUT", &flush_s, err) < 0) {
        free(m);
        return errprefix(err, "rank %d: ", ctx->rank);
    }
    const char *peak = env_get("BMT_PEAK_TFLOPS");
    if (peak) {
        char *end = NULL;
        errno = 0;
        double t = env_plain_decimal(peak) ? strtod(peak, &end) : 0;
        if (!env_plain_decimal(peak) || errno || !isfinite(t) || t <= 0) {
            free(m);
            return errprintf(err,
                             "rank %d: BMT_PEAK_TFLOPS='%.900s' is not a positive number "
                             "(peak TFLOP/s of one rank)",
                             ctx->rank, peak);
        }
        m->peak_flops = t * 1e12;
    }
    device_name(ctx, m->device_name, sizeof(m->device_name));
    if (peak == NULL && ctx->device == BMT_DEVICE_CUDA)
        m->peak_flops = bmt_peak_flops_of(m->device_name);
    const char *job_id = getenv("BMT_JOB_ID");
    snprintf(m->job_id, sizeof(m->job_id), "%s",
             job_id && *job_id ? job_id : boot_info(ctx->boot)->nspace);
    for (int k = 0; k < BMT_MEM_KIND_COUNT; k++)
        m->kind_names[k] = bmt_mem_kind_name((bmt_mem_kind_t)k);
    m->job = (bmt_job_info_t){
        .size = sizeof(bmt_job_info_t),
        .version = BMT_PLUGIN_ABI_VERSION,
        .job_id = m->job_id,
        .hostname = boot_info(ctx->boot)->hostname,
        .device = ctx->device == BMT_DEVICE_CUDA ? "cuda" : "cpu",
        .device_name = m->device_name,
        .backend = ctx->backend ? ctx->backend->name : "",
        .rank = ctx->rank,
        .world = ctx->world,
        .groups = ctx->layout.groups,
        .gpus_per_group = ctx->layout.gpus_per_group,
        .gpus_per_node = ctx->layout.gpus_per_node,
        .nodes = ctx->layout.nodes,
        .group = ctx->self.group,
        .group_rank = ctx->self.group_rank,
        .node = ctx->self.node,
        .local_rank = ctx->self.local_rank,
        .device_index = ctx->device_index,
        .mem_kinds = BMT_MEM_KIND_COUNT,
        .mem_kind_names = m->kind_names,
        .peak_flops = m->peak_flops,
        .start_time = unix_s(),
        .flush_timeout_s = flush_s,
        .libbmt_version = BMT_VERSION_STRING,
        .knob = knob,
        .fail = plugin_fail,
    };
    m->step_start = mono_s();
    m->comm_mark = ctx->comm_host_s;
    ctx->monitor = m;

    const char *list = env_get("BMT_PLUGINS");
    if (list == NULL || *list == '\0')
        return 0;
    char *copy = strdup(list), *save = NULL;
    if (copy == NULL)
        return errprintf(err, "rank %d: out of memory", ctx->rank);
    int rc = 0;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        /* Blanks around an entry go; blanks inside stay, so that "jsonl push"
         * is refused (it was cut to "jsonl", push silently left out) and a
         * path may hold a space. */
        while (isspace((unsigned char)*item))
            item++;
        size_t n = strlen(item);
        while (n > 0 && isspace((unsigned char)item[n - 1]))
            item[--n] = '\0';
        if (*item == '\0')
            continue;
        char why[1024];
        if (m->n == MAX_PLUGINS)
            snprintf(why, sizeof(why), "BMT_PLUGINS names more than %d plugins", MAX_PLUGINS);
        else if (load_one(ctx, m, item, why, sizeof(why)) == 0)
            continue;
        if (warn) {
            say(ctx, "warning: %s; running without it (BMT_PLUGIN_ERRORS=warn)", why);
            continue;
        }
        say(ctx, "%s (BMT_PLUGIN_ERRORS=warn runs without it)", why);
        rc = errprintf(err, "rank %d: %s", ctx->rank, why);
        break;
    }
    free(copy);
    return rc;
}

static void finalize_all(bmt_ctx_t *ctx)
{
    struct monitor *m = ctx->monitor;
    if (m == NULL || m->finalized)
        return;
    m->finalized = true;
    for (int i = m->n - 1; i >= 0; i--)
        m->p[i].api->finalize(m->p[i].state);
}

int monitor_finalize(bmt_ctx_t *ctx)
{
    struct monitor *m = ctx->monitor;
    if (m == NULL)
        return 0;
    finalize_all(ctx); /* a plugin may call job->fail in its finalize: read after */
    bmt_error_t err;
    const int rc = check_plugins(ctx, m, "bmt_finalize", &err);
    if (rc < 0) /* bmt_finalize has no err of its own to fill */
        fprintf(stderr, "bmt: %s\n", err.text);
    free(m);
    ctx->monitor = NULL;
    return rc;
}

static void send_event(struct monitor *m, int kind, int status, const char *detail)
{
    static const char *names[] = { "", "checkpoint_saved", "restart", "abort", "note" };
    /* detail whole: a checkpoint's path may pass 1 KiB */
    bmt_event_t ev = {
        .size = sizeof(ev),
        .version = BMT_PLUGIN_ABI_VERSION,
        .kind = kind,
        .status = status,
        .step = m->last_step,
        .time = unix_s(),
        .name = names[kind],
        .detail = detail ? detail : "",
    };
    double t0 = mono_s();
    for (int i = 0; i < m->n; i++)
        if (m->p[i].api->on_event)
            m->p[i].api->on_event(m->p[i].state, &ev);
    m->plugin_acc += mono_s() - t0;
}

void monitor_abort(bmt_ctx_t *ctx, int status, const char *msg)
{
    struct monitor *m = ctx->monitor;
    if (m == NULL || m->finalized)
        return;
    send_event(m, BMT_EVENT_ABORT, status, msg);
    finalize_all(ctx);
}

/* ------------------------------------------------------------ steps */

void monitor_fill(bmt_step_metrics_t *m, const bmt_step_report_t *r, int64_t reports,
                  double step_time_s, double comm_wait_s, double peak_flops)
{
    const bmt_step_info_t *o = r->optim;
    m->size = sizeof(*m);
    m->version = BMT_PLUGIN_ABI_VERSION;
    m->step = o ? o->step : reports;
    m->step_time_s = step_time_s;
    m->tokens = r->tokens;
    m->samples = r->samples;
    m->loss = r->loss;
    m->tokens_per_s = (double)r->tokens / step_time_s;
    m->samples_per_s = (double)r->samples / step_time_s;
    m->flops = r->flops;
    m->flops_per_s = r->flops > 0 ? r->flops / step_time_s : NAN;
    m->mfu = r->flops > 0 && peak_flops > 0 ? m->flops_per_s / peak_flops : NAN;
    m->comm_wait_s = comm_wait_s;
    m->grad_norm = o ? o->grad_norm : NAN;
    m->lr = o ? o->lr : NAN;
    m->skipped = o && o->skipped;
    m->microbatches = o ? o->microbatches : 0;
    m->skipped_total = o ? o->skipped_total : 0;
    m->params = r->params;
}

void bmt_step_begin(bmt_ctx_t *ctx)
{
    if (ctx == NULL || ctx->monitor == NULL)
        return;
    ctx->monitor->step_start = mono_s();
    ctx->monitor->comm_mark = ctx->comm_host_s;
    bool partial;
    device_wait_collect(ctx, &partial); /* waits before this point are not the step's */
    uint64_t cur[BMT_MEM_KIND_COUNT], peak[BMT_MEM_KIND_COUNT], all;
    device_mem_step_peaks(ctx, cur, peak, &all); /* nor are the peaks */
}

int bmt_report_step(bmt_ctx_t *ctx, const bmt_step_report_t *r, bmt_step_metrics_t *out,
                    bmt_error_t *err)
{
    if (ctx == NULL || r == NULL)
        return errprintf(err, "bmt_report_step: NULL argument");
    struct monitor *m = ctx->monitor;
    if (r->magic != BMT_STEP_REPORT_MAGIC || r->size < sizeof(*r) ||
        r->version != BMT_STEP_REPORT_VERSION)
        return errprintf(err,
                         "rank %d: bmt_report_step: the report was not set up with "
                         "BMT_STEP_REPORT_INITIALIZER of this bmt",
                         ctx->rank);
    if (r->tokens < 0 || r->samples < 0 || r->params < 0 || !(r->flops >= 0) || isinf(r->flops))
        return errprintf(err,
                         "rank %d: bmt_report_step: tokens, samples, params and flops must be "
                         ">= 0 and finite",
                         ctx->rank);
    if (m == NULL || m->finalized)
        return errprintf(err, "rank %d: bmt_report_step after bmt_finalize or bmt_abort",
                         ctx->rank);
    if (check_plugins(ctx, m, "bmt_report_step", err) < 0)
        return -1;
    /* The step's kernels and collectives are part of its time. */
    if (bmt_device_synchronize(ctx, err) < 0)
        return -1;
    double now = mono_s();
    bool partial;
    double gpu_wait = device_wait_collect(ctx, &partial);
    double step_time = now - m->step_start;
    if (step_time < 1e-9)
        step_time = 1e-9;
    bmt_step_metrics_t x;
    memset(&x, 0, sizeof(x));
    m->reports++;
    monitor_fill(&x, r, m->reports, step_time, ctx->comm_host_s - m->comm_mark + gpu_wait,
                 m->peak_flops);
    x.time = unix_s();
    m->tokens_total += r->tokens;
    m->samples_total += r->samples;
    x.tokens_total = m->tokens_total;
    x.samples_total = m->samples_total;
    x.plugin_s = m->plugin_acc;
    x.mem_kinds = BMT_MEM_KIND_COUNT;
    device_mem_step_peaks(ctx, x.mem_current, x.mem_peak, &x.mem_peak_all);
    m->last_step = x.step;
    m->plugin_acc = 0;
    m->step_start = now;
    m->comm_mark = ctx->comm_host_s;

    double t0 = mono_s();
    for (int i = 0; i < m->n; i++)
        m->p[i].api->on_step(m->p[i].state, &x);
    m->plugin_acc += mono_s() - t0;
    if (out)
        *out = x;
    return 0;
}

int bmt_report_event(bmt_ctx_t *ctx, bmt_event_kind_t kind, const char *detail, bmt_error_t *err)
{
    if (ctx == NULL)
        return errprintf(err, "bmt_report_event: NULL context");
    if (kind != BMT_EVENT_CHECKPOINT_SAVED && kind != BMT_EVENT_RESTART && kind != BMT_EVENT_NOTE)
        return errprintf(err,
                         "rank %d: bmt_report_event: kind %d is not checkpoint_saved, restart or "
                         "note (bmt_abort reports aborts)",
                         ctx->rank, (int)kind);
    if (ctx->monitor == NULL || ctx->monitor->finalized)
        return errprintf(err, "rank %d: bmt_report_event after bmt_finalize or bmt_abort",
                         ctx->rank);
    if (check_plugins(ctx, ctx->monitor, "bmt_report_event", err) < 0)
        return -1;
    send_event(ctx->monitor, kind, 0, detail);
    return 0;
}

/* Names are [a-z][a-z0-9_]*: a Prometheus label value and a JSON key as they are. */
bool bmt_scalar_name_ok(const char *s)
{
    if (s == NULL)
        return false;
    size_t n = strlen(s);
    if (n == 0 || n > BMT_SCALAR_NAME_MAX || !(s[0] >= 'a' && s[0] <= 'z'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

int bmt_report_scalar(bmt_ctx_t *ctx, const char *name, double value, bmt_error_t *err)
{
    if (ctx == NULL || name == NULL)
        return errprintf(err, "bmt_report_scalar: NULL argument");
    struct monitor *m = ctx->monitor;
    if (!bmt_scalar_name_ok(name))
        return errprintf(err,
                         "rank %d: bmt_report_scalar: name '%.80s' must be a lower-case letter "
                         "then lower-case letters, digits and '_', at most %d bytes",
                         ctx->rank, name, BMT_SCALAR_NAME_MAX);
    if (m == NULL || m->finalized)
        return errprintf(err, "rank %d: bmt_report_scalar after bmt_finalize or bmt_abort",
                         ctx->rank);
    if (check_plugins(ctx, m, "bmt_report_scalar", err) < 0)
        return -1;
    int i = 0;
    while (i < m->nscalars && strcmp(m->scalars[i], name) != 0)
        i++;
    if (i == m->nscalars) {
        if (m->nscalars == BMT_SCALARS_MAX)
            return errprintf(err,
                             "rank %d: bmt_report_scalar: '%s' would be one name too many: a "
                             "process reports at most %d names (each is a series per job: put "
                             "what changes in the value, not in the name)",
                             ctx->rank, name, BMT_SCALARS_MAX);
        snprintf(m->scalars[m->nscalars++], sizeof(m->scalars[0]), "%s", name);
    }
    bmt_scalar_t sc = {
        .size = sizeof(sc),
        .version = BMT_PLUGIN_ABI_VERSION,
        .step = m->last_step,
        .time = unix_s(),
        .name = m->scalars[i],
        .value = value,
    };
    double t0 = mono_s();
    for (int k = 0; k < m->n; k++)
        if (m->p[k].api->size > BMT_PLUGIN_V1_MIN_SIZE && m->p[k].api->on_scalar)
            m->p[k].api->on_scalar(m->p[k].state, &sc);
    m->plugin_acc += mono_s() - t0;
    return 0;
}

int bmt_plugin_count(const bmt_ctx_t *ctx) { return ctx && ctx->monitor ? ctx->monitor->n : 0; }

const char *bmt_plugin_name(const bmt_ctx_t *ctx, int i)
{
    if (ctx == NULL || ctx->monitor == NULL || i < 0 || i >= ctx->monitor->n)
        return NULL;
    return ctx->monitor->p[i].name;
}
