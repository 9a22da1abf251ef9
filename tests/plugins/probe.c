/* tests/plugins/probe.c — a monitor plugin that writes down every call it gets.
 *
 * Built five ways (Makefile): probe.so (this ABI), probe_v2.so (claims ABI
 * version 2), probe_nosym.so (exports no plugin symbol), probe_small.so (a
 * struct too small to hold the callbacks), probe_48.so (size 48: a plugin built
 * before on_scalar was appended, which libbmt must not call for scalars; its
 * struct still holds probe_on_scalar, so a call would show in the log).
 * tests/integration/test_monitor.sh loads them through BMT_PLUGINS. Settings: BMT_PROBE_LOG file
 * the calls are appended to, one line each: "R init world W job J peak P", "R step S tokens T
 * plugin_s X", "R event NAME status S step S detail D", "R scalar NAME VALUE step S", "R finalize"
 *   BMT_PROBE_FAIL      init fails with this message
 *   BMT_PROBE_SLEEP_MS  on_step sleeps this long (plugin_s must show it)
 * The writes are blocking on purpose: this is a test plugin, not a model.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bmt/plugin.h"

#ifndef PROBE_VERSION
#define PROBE_VERSION BMT_PLUGIN_ABI_VERSION
#endif
#ifndef PROBE_SIZE
#define PROBE_SIZE sizeof(bmt_monitor_plugin_v1_t)
#endif

struct probe {
    int fd, rank;
    double sleep_ms;
};

static void line(struct probe *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(struct probe *p, const char *fmt, ...)
{
    char buf[8192]; /* a checkpoint event's detail may pass 1 KiB */
    int n = snprintf(buf, sizeof(buf), "%d ", p->rank);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(buf) - 2)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    if (write(p->fd, buf, (size_t)n) < 0)
        perror("probe");
}

static int probe_init(const bmt_job_info_t *job, void **state, char *err, size_t len)
{
    const char *fail = getenv("BMT_PROBE_FAIL"), *log = getenv("BMT_PROBE_LOG");
    if (fail) {
        snprintf(err, len, "%s", fail);
        return -1;
    }
    if (log == NULL) {
        snprintf(err, len, "BMT_PROBE_LOG is not set");
        return -1;
    }
    struct probe *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -1;
    p->rank = job->rank;
    p->fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    const char *ms = getenv("BMT_PROBE_SLEEP_MS");
    p->sleep_ms = ms ? atof(ms) : 0;
    if (p->fd < 0) {
        snprintf(err, len, "cannot open %s", log);
        free(p);
        return -1;
    }
    line(p, "init world %d job %s peak %g size %u knob %s", job->world, job->job_id,
         job->peak_flops, job->size, job->knob("BMT_PLUGIN_ERRORS"));
    *state = p;
    return 0;
}

static void probe_on_step(void *state, const bmt_step_metrics_t *m)
{
    struct probe *p = state;
    line(p, "step %lld tokens %lld plugin_s %.6f", (long long)m->step, (long long)m->tokens,
         m->plugin_s);
    if (p->sleep_ms > 0) {
        struct timespec ts = { (time_t)(p->sleep_ms / 1e3),
                               (long)((long)p->sleep_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
}

static void probe_on_event(void *state, const bmt_event_t *e)
{
    struct probe *p = state;
    line(p, "event %s status %d step %lld detail %s", e->name, e->status, (long long)e->step,
         e->detail);
}

static void probe_on_scalar(void *state, const bmt_scalar_t *sc)
{
    struct probe *p = state;
    line(p, "scalar %s %.17g step %lld", sc->name, sc->value, (long long)sc->step);
}

static void probe_finalize(void *state)
{
    struct probe *p = state;
    line(p, "finalize");
    close(p->fd);
    free(p);
}

#ifndef PROBE_NO_SYMBOL
BMT_PLUGIN_EXPORT const bmt_monitor_plugin_v1_t bmt_monitor_plugin_v1 = {
    PROBE_SIZE,    PROBE_VERSION,  "probe",        probe_init,
    probe_on_step, probe_on_event, probe_finalize, probe_on_scalar,
};
#else
BMT_PLUGIN_EXPORT const bmt_monitor_plugin_v1_t not_the_plugin_symbol = {
    PROBE_SIZE,    PROBE_VERSION,  "probe",        probe_init,
    probe_on_step, probe_on_event, probe_finalize, probe_on_scalar,
};
#endif
