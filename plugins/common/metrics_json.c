/* plugins/common/metrics_json.c — see metrics_json.h. */
#include "metrics_json.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

json_t *metrics_real(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* The length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong
 * forms, no surrogates, at most U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
    if (n == 0)
        return 0;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

size_t metrics_utf8_copy(char *dst, size_t size, const char *src)
{
    if (size == 0)
        return 0;
    const unsigned char *s = (const unsigned char *)(src ? src : "");
    size_t o = 0;
    while (*s) {
        size_t n = utf8_seq(s);
        if (n == 0) { /* not UTF-8: one byte, shown as '?' */
            if (o + 1 > size - 1)
                break;
            dst[o++] = '?';
            s++;
            continue;
        }
        if (o + n > size - 1)
            break; /* never half a character */
        memcpy(dst + o, s, n);
        o += n;
        s += n;
    }
    dst[o] = '\0';
    return o;
}

void metrics_event_copy(metrics_event_t *dst, const bmt_event_t *ev)
{
    memset(dst, 0, sizeof(*dst));
    dst->kind = ev->kind;
    dst->status = ev->status;
    dst->step = ev->step;
    dst->time = ev->time;
    metrics_utf8_copy(dst->name, sizeof(dst->name), ev->name);
    metrics_utf8_copy(dst->detail, sizeof(dst->detail), ev->detail);
}

void metrics_item_step(metrics_item_t *it, const bmt_step_metrics_t *m)
{
    memset(it, 0, sizeof(*it));
    it->type = METRICS_STEP;
    memcpy(&it->u.step, m, m->size < sizeof(it->u.step) ? m->size : sizeof(it->u.step));
}

void metrics_item_event(metrics_item_t *it, const bmt_event_t *ev)
{
    memset(it, 0, sizeof(*it));
    it->type = METRICS_EVENT;
    metrics_event_copy(&it->u.event, ev);
}

void metrics_item_scalar(metrics_item_t *it, const bmt_scalar_t *sc)
{
    memset(it, 0, sizeof(*it));
    it->type = METRICS_SCALAR;
    it->u.scalar.step = sc->step;
    it->u.scalar.time = sc->time;
    it->u.scalar.value = sc->value;
    snprintf(it->u.scalar.name, sizeof(it->u.scalar.name), "%s", sc->name ? sc->name : "");
}

double metrics_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double metrics_unix_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int set(json_t *o, const char *key, json_t *v)
{
    return v ? json_object_set_new(o, key, v) : -1;
}

json_t *metrics_step_json(const bmt_step_metrics_t *m, const char *const *kind_names, int kinds)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    int bad = 0;
#define I64(f) bad |= set(o, #f, json_integer((json_int_t)m->f))
#define I32(f) bad |= set(o, #f, json_integer((json_int_t)m->f))
#define F64(f) bad |= set(o, #f, metrics_real(m->f))
#define X(f, kind) kind(f);
    METRICS_FIELDS(X)
#undef X
#undef I64
#undef I32
#undef F64
    json_t *mem = json_object();
    bad |= set(o, "memory", mem);
    for (int k = 0; mem && k < kinds && k < m->mem_kinds && k < BMT_METRICS_MEM_KINDS; k++)
        bad |= set(mem, kind_names[k],
                   json_pack("{sIsI}", "current", (json_int_t)m->mem_current[k], "peak",
                             (json_int_t)m->mem_peak[k]));
    /* Appended to the ABI (docs/metrics.md: present when size > 432): the
     * most of all kinds at once, which the per-kind peaks cannot give. Only
     * from a libbmt that fills it, and only when memory was measured. */
    if (m->size > offsetof(bmt_step_metrics_t, mem_peak_all) && m->mem_kinds > 0)
        bad |= set(o, "mem_peak_all", json_integer((json_int_t)m->mem_peak_all));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *metrics_event_json(const metrics_event_t *ev)
{
    return json_pack("{sssisIsoss}", "kind", ev->name, "status", (int)ev->status, "step",
                     (json_int_t)ev->step, "time", metrics_real(ev->time), "detail", ev->detail);
}

json_t *metrics_scalar_json(const metrics_scalar_t *sc)
{
    return json_pack("{sssosIso}", "name", sc->name, "value", metrics_real(sc->value), "step",
                     (json_int_t)sc->step, "time", metrics_real(sc->time));
}

static int get_i64(const json_t *o, const char *key, int64_t *out, char *why, size_t len)
{
    const json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return *out = 0, 0;
    if (json_is_integer(v))
        return *out = (int64_t)json_integer_value(v), 0;
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
        fabs(json_real_value(v)) < 9e18)
        return *out = (int64_t)json_real_value(v), 0;
    snprintf(why, len, "field \"%s\" must be an integer", key);
    return -1;
}

static int get_f64(const json_t *o, const char *key, double *out, char *why, size_t len)
{
    const json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return *out = NAN, 0;
    if (json_is_number(v))
        return *out = json_number_value(v), 0;
    snprintf(why, len, "field \"%s\" must be a number or null", key);
    return -1;
}

int metrics_step_parse(const json_t *o, bmt_step_metrics_t *m, const char *const *kind_names,
                       int kinds, char *why, size_t len)
{
    if (!json_is_object(o)) {
        snprintf(why, len, "a step must be a JSON object");
        return -1;
    }
    memset(m, 0, sizeof(*m));
    m->size = sizeof(*m);
    m->version = BMT_PLUGIN_ABI_VERSION;
    int64_t i;
#define I64(f)                                                                                     \
    if (get_i64(o, #f, &m->f, why, len) < 0)                                                       \
        return -1;
#define I32(f)                                                                                     \
    if (get_i64(o, #f, &i, why, len) < 0 || i < INT32_MIN || i > INT32_MAX)                        \
        return snprintf(why, len, "field \"%s\" must be a 32-bit integer", #f), -1;                \
    m->f = (int32_t)i;
#define F64(f)                                                                                     \
    if (get_f64(o, #f, &m->f, why, len) < 0)                                                       \
        return -1;
#define X(f, kind) kind(f)
    METRICS_FIELDS(X)
#undef X
#undef I64
#undef I32
#undef F64
    const json_t *mem = json_object_get(o, "memory");
    if (mem && !json_is_object(mem) && !json_is_null(mem)) {
        snprintf(why, len, "field \"memory\" must be an object");
        return -1;
    }
    int nk = kinds < BMT_METRICS_MEM_KINDS ? kinds : BMT_METRICS_MEM_KINDS;
    bool any = false; /* no kind given ("memory": {} of a Python job): not measured */
    for (int k = 0; mem && k < nk; k++) {
        const json_t *e = json_object_get(mem, kind_names[k]);
        if (e == NULL)
            continue;
        any = true;
        int64_t cur, peak;
        if (!json_is_object(e) || get_i64(e, "current", &cur, why, len) < 0 ||
            get_i64(e, "peak", &peak, why, len) < 0 || cur < 0 || peak < 0) {
            snprintf(why, len, "memory \"%s\" must be {\"current\": bytes, \"peak\": bytes}",
                     kind_names[k]);
            return -1;
        }
        m->mem_current[k] = (uint64_t)cur;
        m->mem_peak[k] = (uint64_t)peak;
    }
    m->mem_kinds = any ? nk : 0;
    int64_t all = 0;
    if (get_i64(o, "mem_peak_all", &all, why, len) < 0 || all < 0)
        return snprintf(why, len, "field \"mem_peak_all\" must be a count of bytes"), -1;
    m->mem_peak_all = any ? (uint64_t)all : 0;
    return 0;
}

int metrics_event_parse(const json_t *o, metrics_event_t *ev, char *why, size_t len)
{
    memset(ev, 0, sizeof(*ev));
    const json_t *kind = json_object_get(o, "kind"), *detail = json_object_get(o, "detail");
    if (!json_is_object(o) || !json_is_string(kind)) {
        snprintf(why, len, "an event must be an object with a string \"kind\"");
        return -1;
    }
    static const char *kinds[] = { "checkpoint_saved", "restart", "abort", "note" };
    for (int k = 0; k < 4; k++)
        if (strcmp(json_string_value(kind), kinds[k]) == 0)
            ev->kind = k + 1;
    if (ev->kind == 0) {
        snprintf(why, len, "unknown event kind \"%.40s\"", json_string_value(kind));
        return -1;
    }
    snprintf(ev->name, sizeof(ev->name), "%s", kinds[ev->kind - 1]);
    if (detail && !json_is_string(detail)) {
        snprintf(why, len, "event field \"detail\" must be a string");
        return -1;
    }
    metrics_utf8_copy(ev->detail, sizeof(ev->detail), detail ? json_string_value(detail) : "");
    int64_t status;
    if (get_i64(o, "step", &ev->step, why, len) < 0 ||
        get_f64(o, "time", &ev->time, why, len) < 0 || get_i64(o, "status", &status, why, len) < 0)
        return -1;
    if (status < INT32_MIN || status > INT32_MAX) {
        snprintf(why, len, "event field \"status\" must be a 32-bit integer (%lld)",
                 (long long)status);
        return -1;
    }
    ev->status = (int32_t)status;
    return 0;
}

int metrics_scalar_parse(const json_t *o, metrics_scalar_t *sc, char *why, size_t len)
{
    memset(sc, 0, sizeof(*sc));
    const json_t *name = json_object_get(o, "name");
    if (!json_is_object(o) || !json_is_string(name) ||
        strlen(json_string_value(name)) > BMT_SCALAR_NAME_MAX) {
        snprintf(why, len, "a scalar must be an object with a string \"name\" of at most %d bytes",
                 BMT_SCALAR_NAME_MAX);
        return -1;
    }
    snprintf(sc->name, sizeof(sc->name), "%s", json_string_value(name));
    if (get_f64(o, "value", &sc->value, why, len) < 0 ||
        get_i64(o, "step", &sc->step, why, len) < 0 || get_f64(o, "time", &sc->time, why, len) < 0)
        return -1;
    return 0;
}

int metrics_run_make(metrics_run_t *run, int64_t restart, char *why, size_t len)
{
    unsigned char raw[METRICS_RUN_ID_LEN / 2];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        snprintf(why, len, "getrandom: %s", strerror(errno));
        return -1;
    }
    memset(run, 0, sizeof(*run));
    run->restart = restart;
    run->start = metrics_unix_s();
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(run->id + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

json_t *metrics_run_json(const metrics_run_t *run)
{
    return json_pack("{sIsfss}", "restart", (json_int_t)run->restart, "start", run->start, "id",
                     run->id);
}

int metrics_run_parse(const json_t *o, metrics_run_t *run, char *why, size_t len)
{
    memset(run, 0, sizeof(*run));
    const json_t *restart = json_object_get(o, "restart"), *start = json_object_get(o, "start"),
                 *id = json_object_get(o, "id");
    if (!json_is_object(o)) {
        snprintf(why, len,
                 "\"run\" must be an object {\"restart\": BMT_RESTART, \"start\": unix seconds, "
                 "\"id\": %d hex digits}",
                 METRICS_RUN_ID_LEN);
        return -1;
    }
    if (!json_is_integer(restart) || json_integer_value(restart) < 0) {
        snprintf(why, len, "run field \"restart\" must be a count (the process's BMT_RESTART)");
        return -1;
    }
    if (!json_is_number(start) || !isfinite(json_number_value(start)) ||
        !(json_number_value(start) > 0)) {
        snprintf(why, len, "run field \"start\" must be a positive number (unix seconds)");
        return -1;
    }
    const char *s = json_is_string(id) ? json_string_value(id) : "";
    if (strlen(s) != METRICS_RUN_ID_LEN || strspn(s, "0123456789abcdef") != METRICS_RUN_ID_LEN) {
        snprintf(why, len, "run field \"id\" must be %d lower-case hex digits", METRICS_RUN_ID_LEN);
        return -1;
    }
    run->restart = (int64_t)json_integer_value(restart);
    run->start = json_number_value(start);
    memcpy(run->id, s, METRICS_RUN_ID_LEN + 1);
    return 0;
}

int metrics_run_cmp(const metrics_run_t *a, const metrics_run_t *b)
{
    if (a->restart != b->restart)
        return a->restart < b->restart ? -1 : 1;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return strcmp(a->id, b->id);
}
