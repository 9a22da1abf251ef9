/* plugins/push/push.c — send each step's metrics over HTTP, never stalling training.
 *
 * on_step, on_event and on_scalar copy the item into a bounded queue
 * (common/queue.c) and return. A thread of the plugin takes what is queued and
 *   - POSTs it as one JSON document to BMT_METRICS_URL (bmlaunch's collector),
 *     with "Authorization: Bearer BMT_METRICS_TOKEN":
 *       {"version": 2, "job": ..., "rank": r, "run": {"restart": BMT_RESTART,
 *        "start": unix seconds, "id": 16 hex digits}, "host": ..., "device_name": ...,
 *        "peak_flops": ..., "dropped": n, "steps": [...], "events": [...],
 *        "scalars": [...]}
 *     "run" is made once, at init: it tells this process's pushes from those
 *     of an earlier run of the job or an earlier process of this rank, whose
 *     late pushes the collector refuses (409) instead of letting them reset
 *     what it shows. "dropped" counts every item lost so far (uint64; sent
 *     capped at 2^53, which no process reaches, so it never wraps or turns
 *     negative on the wire).
 *     A collector that cannot be reached (or answers 5xx/408/429) gets the same
 *     items again later, with backoff from 0.1 s to 5 s; meanwhile new items
 *     queue up and, when the queue is full, the oldest are dropped and counted
 *     ("dropped" in the next document that gets through). A refusal for good
 *     (other 4xx: bad token, malformed) drops those items and says why once.
 *     An https URL is checked against BMT_METRICS_CA_PEM when set (the job's
 *     certificate as the only CA, host name not checked: pinning), else
 *     against the system's CAs.
 *   - PUTs the latest step as Prometheus text to a Pushgateway at
 *     BMT_PUSHGATEWAY_URL/metrics/job/bmt/job_id/<job>/rank/<rank> (replacing
 *     that rank's group), when that variable is set. A job id holding a '/'
 *     goes as job_id@base64/<base64url of it> (the Pushgateway's encoding of
 *     such label values: it refuses an escaped one with 400).
 * finalize sends what is left within job->flush_timeout_s and stops the thread.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bmt/plugin.h"
#include "../common/metrics_json.h"
#include "../common/prom.h"
#include "../common/queue.h"

#define BATCH 256

struct push {
    pq_t *q;
    pthread_t thread;
    bool started;
    int rank;
    metrics_run_t run; /* this process's run identity, sent with every push */
    char job[256], host[256], device_name[128];
    double peak_flops;
    const char *kind_names[BMT_METRICS_MEM_KINDS];
    char kind_store[BMT_METRICS_MEM_KINDS][32];
    int kinds;
    char *url, *gateway_url;
    struct curl_slist *headers;
    CURL *curl, *gw;
    long timeout_ms;
    double flush_s;
    _Atomic double deadline; /* monotonic; set at finalize (read by the thread) */
    bool failing;            /* the last send failed (said once) */
    double fail_since;
    long refused_code; /* last 4xx said, to say each kind once */
    bool gw_failing;
    metrics_item_t batch[BATCH];
};

static void say(const struct push *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const struct push *p, const char *fmt, ...)
{
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "bmt: rank %d: push: %s\n", p->rank, line);
}

static size_t discard(char *ptr, size_t size, size_t n, void *user)
{
    char *body = user; /* keep the start of the answer for messages */
    size_t have = strlen(body), len = size * n;
    if (have < 200) {
        size_t k = len < 200 - have ? len : 200 - have;
        memcpy(body + have, ptr, k);
        body[have + k] = '\0';
    }
    return len;
}

/* The timeout of one request: the configured one, or what is left of the
 * flush time at finalize. 0 when nothing is left. */
static long request_timeout(const struct push *p)
{
    double deadline = p->deadline;
    if (deadline == 0)
        return p->timeout_ms;
    double left = (deadline - metrics_mono_s()) * 1e3;
    if (left < 1)
        return 0;
    return left < (double)p->timeout_ms ? (long)left : p->timeout_ms;
}

/* libcurl calls this at least once a second during a request: a request in
 * flight when finalize's flush time runs out is abandoned then, whatever its
 * own timeout (a collector that accepts and never answers). */
static int abandon_late(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                        curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    const struct push *p = user;
    double deadline = p->deadline;
    return deadline != 0 && metrics_mono_s() >= deadline;
}

enum {
    SENT,
    RETRY,
    REFUSED
};

/* One HTTP request; returns SENT, RETRY (unreachable, timeout, 5xx, 429) or
 * REFUSED (another 4xx), with the status and the answer's start in msg. */
static int http(struct push *p, CURL *c, const char *method, const char *url, const char *body,
                const char *content_type, char *msg, size_t len)
{
    long timeout = request_timeout(p);
    if (timeout == 0) {
        snprintf(msg, len, "no time left to flush");
        return RETRY;
    }
    char answer[208] = "";
    char ctype[128];
    snprintf(ctype, sizeof(ctype), "Content-Type: %s", content_type);
    struct curl_slist *h = curl_slist_append(NULL, ctype);
    for (struct curl_slist *x = p->headers; h && x && c == p->curl; x = x->next)
        h = curl_slist_append(h, x->data);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout);
    /* the whole request, connecting included, within BMT_METRICS_TIMEOUT: a
     * collector that 1000 ranks reach at once (their last pushes at the job's
     * end) may take seconds to accept, and a connect capped shorter than the
     * request timed out there and lost a batch at finalize (test_monitor) */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, abandon_late);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, p);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, answer);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(h);
    if (rc != CURLE_OK) {
        bool tls = rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE;
        snprintf(msg, len, "%s %s: %s%s", method, url, curl_easy_strerror(rc),
                 tls ? " (the server's certificate is not the one BMT_METRICS_CA_PEM pins, or "
                       "none the system trusts)"
                     : "");
        return RETRY;
    }
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    answer[strcspn(answer, "\r\n")] = '\0';
    snprintf(msg, len, "%s %s: HTTP %ld %s", method, url, code, answer);
    if (code >= 200 && code < 300)
        return SENT;
    return code >= 500 || code == 429 || code == 408 ? RETRY : REFUSED;
}

static char *collector_body(struct push *p, size_t n)
{
    json_t *arr[3] = { json_array(), json_array(), json_array() }; /* by metrics_item_type_t */
    uint64_t dropped = pq_dropped(p->q);
    json_t *doc = json_pack(
        "{sisssisosssssosIsososo}", "version", METRICS_PROTOCOL_VERSION, "job", p->job, "rank",
        p->rank, "run", metrics_run_json(&p->run), "host", p->host, "device_name", p->device_name,
        "peak_flops", metrics_real(p->peak_flops), "dropped",
        (json_int_t)(dropped < METRICS_DROPPED_MAX ? dropped : METRICS_DROPPED_MAX), "steps",
        arr[METRICS_STEP], "events", arr[METRICS_EVENT], "scalars", arr[METRICS_SCALAR]);
    if (doc == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const metrics_item_t *it = &p->batch[i];
        json_t *x = it->type == METRICS_EVENT ? metrics_event_json(&it->u.event)
                    : it->type == METRICS_SCALAR
                        ? metrics_scalar_json(&it->u.scalar)
                        : metrics_step_json(&it->u.step, p->kind_names, p->kinds);
        if (x)
            json_array_append_new(arr[it->type], x);
    }
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return s;
}

/* The latest step as the Pushgateway's text (no job label: the URL has it). */
static char *gateway_body(struct push *p, const bmt_step_metrics_t *m)
{
    prom_buf_t b = { 0 };
    static const struct {
        const char *name, *help;
        size_t off;
    } g[] = {
        { "bmt_rank_step", "last optimizer step of the rank", offsetof(bmt_step_metrics_t, step) },
        { "bmt_rank_tokens_per_second", "tokens per second of the rank's last step",
          offsetof(bmt_step_metrics_t, tokens_per_s) },
        { "bmt_rank_step_duration_seconds", "wall time of the rank's last step",
          offsetof(bmt_step_metrics_t, step_time_s) },
        { "bmt_rank_loss", "the rank's last loss", offsetof(bmt_step_metrics_t, loss) },
        { "bmt_rank_mfu_ratio", "model FLOP utilization of the rank's last step",
          offsetof(bmt_step_metrics_t, mfu) },
        { "bmt_rank_comm_wait_seconds", "time the rank's last step waited on communication",
          offsetof(bmt_step_metrics_t, comm_wait_s) },
    };
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++) {
        prom_family(&b, g[i].name, "gauge", g[i].help);
        const char *base = (const char *)m + g[i].off;
        double v = g[i].off == offsetof(bmt_step_metrics_t, step) ? (double)*(const int64_t *)base
                                                                  : *(const double *)base;
        prom_sample(&b, g[i].name, NULL, v);
    }
    prom_family(&b, "bmt_rank_tokens_total", "counter", "tokens the rank processed");
    prom_sample(&b, "bmt_rank_tokens_total", NULL, (double)m->tokens_total);
    if (b.oom) {
        prom_buf_free(&b);
        return NULL;
    }
    return b.data;
}

static void send_collector(struct push *p, size_t n)
{
    char *body = collector_body(p, n);
    if (body == NULL) {
        pq_count_dropped(p->q, n);
        return;
    }
    char msg[512];
    int rc = http(p, p->curl, "POST", p->url, body, "application/json", msg, sizeof(msg));
    free(body);
    if (rc == SENT) {
        if (p->failing)
            say(p, "the collector answers again after %.1f s (%llu items dropped so far)",
                metrics_mono_s() - p->fail_since, (unsigned long long)pq_dropped(p->q));
        p->failing = false;
        return;
    }
    if (rc == REFUSED) {
        long code = 0;
        curl_easy_getinfo(p->curl, CURLINFO_RESPONSE_CODE, &code);
        if (code != p->refused_code)
            say(p, "the collector refused %zu items: %s%s", n, msg,
                code == 401   ? " (check BMT_METRICS_TOKEN)"
                : code == 409 ? " (a newer run of this rank pushes now: this process's "
                                "metrics are no longer shown)"
                              : "");
        p->refused_code = code;
        pq_count_dropped(p->q, n);
        return;
    }
    if (!p->failing) {
        say(p, "cannot reach the collector, will retry and drop the oldest items when %s: %s",
            "the queue is full", msg);
        p->fail_since = metrics_mono_s();
    }
    p->failing = true;
    if (p->deadline != 0) /* finalizing: no second chance */
        pq_count_dropped(p->q, n);
    else
        pq_unpop(p->q, p->batch, n);
}

static void send_gateway(struct push *p, size_t n)
{
    const bmt_step_metrics_t *last = NULL;
    for (size_t i = 0; i < n; i++)
        if (p->batch[i].type == METRICS_STEP)
            last = &p->batch[i].u.step;
    if (last == NULL)
        return;
    char *body = gateway_body(p, last);
    if (body == NULL)
        return;
    char msg[512];
    int rc =
        http(p, p->gw, "PUT", p->gateway_url, body, "text/plain; version=0.0.4", msg, sizeof(msg));
    free(body);
    if (rc != SENT && !p->gw_failing)
        say(p, "Pushgateway: %s (keeps trying with the next steps)", msg);
    else if (rc == SENT && p->gw_failing)
        say(p, "Pushgateway answers again");
    p->gw_failing = rc != SENT;
}

static void *run(void *arg)
{
    struct push *p = arg;
    double backoff = 0;
    for (;;) {
        bool closing = pq_closed(p->q);
        size_t n = pq_pop(p->q, p->batch, BATCH, closing ? 0 : 1.0);
        if (n == 0) {
            if (closing)
                break;
            continue;
        }
        if (p->gw)
            send_gateway(p, n);
        if (p->curl)
            send_collector(p, n);
        if (p->failing && p->deadline == 0) {
            backoff = backoff == 0 ? 0.1 : backoff * 2 > 5 ? 5 : backoff * 2;
            pq_nap(p->q, backoff);
        } else
            backoff = 0;
        if (p->deadline != 0 && metrics_mono_s() >= p->deadline) { /* flush time is up */
            for (size_t k; (k = pq_pop(p->q, p->batch, BATCH, 0)) > 0;)
                pq_count_dropped(p->q, k);
            break;
        }
    }
    return NULL;
}

static void destroy(struct push *p)
{
    if (p->curl)
        curl_easy_cleanup(p->curl);
    if (p->gw)
        curl_easy_cleanup(p->gw);
    curl_slist_free_all(p->headers);
    pq_destroy(p->q);
    free(p->url);
    free(p->gateway_url);
    free(p);
}

static int fail(struct push *p, char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct push *p, char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    destroy(p);
    return -1;
}

/* BMT_METRICS_CA_PEM: the collector's certificate, the only CA trusted for an
 * https BMT_METRICS_URL, and no host name check (bmlaunch --rank-exec rewrites
 * the URL's host per node; the job's key never leaves bmlaunch). */
static int pin_ca(CURL *c, const char *url, const char *pem, char *err, size_t len)
{
    if (pem == NULL || *pem == '\0' || strncmp(url, "https://", 8) != 0)
        return 0;
    if (strstr(pem, "-----BEGIN CERTIFICATE-----") == NULL)
        return snprintf(err, len, "BMT_METRICS_CA_PEM holds no PEM certificate"), -1;
    struct curl_blob blob = { (void *)pem, strlen(pem), CURL_BLOB_COPY };
    CURLcode rc = curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &blob);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    if (rc == CURLE_OK)
        rc = curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    if (rc != CURLE_OK)
        return snprintf(err, len, "this libcurl cannot pin BMT_METRICS_CA_PEM: %s",
                        curl_easy_strerror(rc)),
               -1;
    return 0;
}

static bool http_url(const char *u)
{
    return strncmp(u, "http://", 7) == 0 || strncmp(u, "https://", 8) == 0;
}

/* s as base64url (RFC 4648 section 5, with its padding) into out, which holds
 * at least 4 ceil(strlen(s) / 3) + 1 bytes. */
static void base64url(char *out, const char *s)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), k = 0;
    for (size_t i = 0; i < n; i += 3) {
        const unsigned v = (unsigned)u[i] << 16 | (i + 1 < n ? (unsigned)u[i + 1] << 8 : 0) |
                           (i + 2 < n ? u[i + 2] : 0);
        out[k++] = a[v >> 18 & 63];
        out[k++] = a[v >> 12 & 63];
        out[k++] = i + 1 < n ? a[v >> 6 & 63] : '=';
        out[k++] = i + 2 < n ? a[v & 63] : '=';
    }
    out[k] = '\0';
}

static int push_init(const bmt_job_info_t *job, void **state, char *err, size_t len)
{
    struct push *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return snprintf(err, len, "out of memory"), -1;
    p->rank = job->rank;
    snprintf(p->job, sizeof(p->job), "%s", job->job_id);
    snprintf(p->host, sizeof(p->host), "%s", job->hostname);
    snprintf(p->device_name, sizeof(p->device_name), "%s", job->device_name);
    p->peak_flops = job->peak_flops;
    p->flush_s = job->flush_timeout_s;
    p->kinds = job->mem_kinds < BMT_METRICS_MEM_KINDS ? job->mem_kinds : BMT_METRICS_MEM_KINDS;
    for (int k = 0; k < p->kinds; k++) {
        snprintf(p->kind_store[k], sizeof(p->kind_store[k]), "%s", job->mem_kind_names[k]);
        p->kind_names[k] = p->kind_store[k];
    }
    const char *url = job->knob("BMT_METRICS_URL"), *gw = job->knob("BMT_PUSHGATEWAY_URL");
    const char *token = job->knob("BMT_METRICS_TOKEN");
    const char *qs = job->knob("BMT_METRICS_QUEUE"), *ts = job->knob("BMT_METRICS_TIMEOUT");
    if ((url == NULL || *url == '\0') && (gw == NULL || *gw == '\0'))
        return fail(p, err, len,
                    "neither BMT_METRICS_URL (bmlaunch sets it when its metrics endpoint is on) "
                    "nor BMT_PUSHGATEWAY_URL is set");
    if (url && *url && !http_url(url))
        return fail(p, err, len, "BMT_METRICS_URL='%.100s' is not an http:// or https:// URL", url);
    if (gw && *gw && !http_url(gw))
        return fail(p, err, len, "BMT_PUSHGATEWAY_URL='%.100s' is not an http:// or https:// URL",
                    gw);
    const char *rs = job->knob("BMT_RESTART");
    char *end = NULL;
    long long restart = rs && *rs ? strtoll(rs, &end, 10) : 0;
    if (rs && *rs && (*end != '\0' || restart < 0 || restart > INT32_MAX))
        return fail(p, err, len, "BMT_RESTART='%.40s' must be a count (bmlaunch sets it)", rs);
    char why[160];
    if (metrics_run_make(&p->run, restart, why, sizeof(why)) < 0)
        return fail(p, err, len, "cannot make the run id: %s", why);
    /* digits only: strtol and strtod alone take blanks, a sign, hex, exponents */
    long cap = qs && qs[0] >= '0' && qs[0] <= '9' ? strtol(qs, &end, 10) : 0;
    if (cap == 0 || *end != '\0' || cap < 1 || cap > 1000000)
        return fail(p, err, len, "BMT_METRICS_QUEUE='%.40s' must be a count from 1 to 1000000",
                    qs ? qs : "");
    const size_t tw = ts ? strspn(ts, "0123456789") : 0;
    const size_t tf = ts && ts[tw] == '.' ? strspn(ts + tw + 1, "0123456789") : 0;
    const int plain = ts && tw + tf > 0 && ts[tw + (ts[tw] == '.' ? 1 + tf : 0)] == '\0';
    double t = plain ? strtod(ts, &end) : 0;
    if (!plain || !(t > 0) || t > 3600)
        return fail(p, err, len, "BMT_METRICS_TIMEOUT='%.40s' must be seconds in (0, 3600]",
                    ts ? ts : "");
    p->timeout_ms = (long)(t * 1e3) > 0 ? (long)(t * 1e3) : 1;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return fail(p, err, len, "curl_global_init failed");
    p->q = pq_create((size_t)cap, sizeof(metrics_item_t));
    if (p->q == NULL)
        return fail(p, err, len, "out of memory for a queue of %ld items", cap);
    if (url && *url) {
        if (token == NULL || *token == '\0')
            return fail(p, err, len,
                        "BMT_METRICS_URL is set but BMT_METRICS_TOKEN is not (bmlaunch sets both)");
        p->url = strdup(url);
        char auth[600];
        snprintf(auth, sizeof(auth), "Authorization: Bearer %.512s", token);
        p->headers = curl_slist_append(NULL, auth);
        p->curl = curl_easy_init();
        if (p->url == NULL || p->headers == NULL || p->curl == NULL)
            return fail(p, err, len, "out of memory");
        if (pin_ca(p->curl, url, job->knob("BMT_METRICS_CA_PEM"), err, len) < 0) {
            destroy(p);
            return -1;
        }
    }
    if (gw && *gw) {
        p->gw = curl_easy_init();
        /* a '/' in a label value, even escaped as %2F, is not one: the
         * Pushgateway wants such a value as base64url, after "@base64" */
        const bool b64 = strchr(p->job, '/') != NULL;
        char job_b64[sizeof(p->job) / 3 * 4 + 8];
        if (b64)
            base64url(job_b64, p->job);
        char *job_esc = p->gw && !b64 ? curl_easy_escape(p->gw, p->job, 0) : NULL;
        const char *job_part = b64 ? job_b64 : job_esc;
        size_t n = strlen(gw) + (job_part ? strlen(job_part) : 0) + 96;
        p->gateway_url = job_part ? malloc(n) : NULL;
        if (p->gateway_url)
            snprintf(p->gateway_url, n, "%s%smetrics/job/bmt/job_id%s/%s/rank/%d", gw,
                     gw[strlen(gw) - 1] == '/' ? "" : "/", b64 ? "@base64" : "", job_part, p->rank);
        curl_free(job_esc);
        if (p->gateway_url == NULL)
            return fail(p, err, len, "out of memory");
    }
    if (pthread_create(&p->thread, NULL, run, p) != 0)
        return fail(p, err, len, "cannot start its thread");
    p->started = true;
    *state = p;
    return 0;
}

static void push_on_step(void *state, const bmt_step_metrics_t *m)
{
    struct push *p = state;
    metrics_item_t it;
    metrics_item_step(&it, m);
    pq_push(p->q, &it);
}

static void push_on_event(void *state, const bmt_event_t *ev)
{
    struct push *p = state;
    metrics_item_t it;
    metrics_item_event(&it, ev);
    pq_push(p->q, &it);
}

static void push_on_scalar(void *state, const bmt_scalar_t *sc)
{
    struct push *p = state;
    metrics_item_t it;
    metrics_item_scalar(&it, sc);
    pq_push(p->q, &it);
}

static void push_finalize(void *state)
{
    struct push *p = state;
    if (p == NULL)
        return;
    p->deadline = metrics_mono_s() + p->flush_s;
    pq_close(p->q);
    if (p->started)
        pthread_join(p->thread, NULL);
    uint64_t dropped = pq_dropped(p->q);
    if (dropped)
        say(p, "%llu metrics items were dropped in all (collector down or too slow)",
            (unsigned long long)dropped);
    destroy(p);
}

BMT_PLUGIN_EXPORT const bmt_monitor_plugin_v1_t bmt_monitor_plugin_v1 = {
    sizeof(bmt_monitor_plugin_v1_t),
    BMT_PLUGIN_ABI_VERSION,
    "push",
    push_init,
    push_on_step,
    push_on_event,
    push_finalize,
    push_on_scalar,
};
