/* launcher/collector.c — the metrics endpoint: ingest pushes, aggregate, serve.
 *
 * State: each rank's latest metrics (what /metrics aggregates, so a scrape
 * costs O(world) and the series are per job and per group), plus a history of
 * whole-job steps for the page. A step enters the history once every rank has
 * reported it, or when a later step pushes it out of the window of SLOTS
 * steps being assembled (then it carries the ranks it had). One mutex guards
 * everything; libmicrohttpd's threads take it for an ingest or a render, the
 * supervisor for a rank's exit.
 *
 * Pushes are validated whole before anything is applied (bad input changes
 * nothing): token first (401, before the body is even read), size (413, from
 * Content-Length when given), then JSON shape, job id, rank, run, every field's
 * type, and whether the values are possible and the steps near the job's (400
 * with the reason in the body): one rank numbering its steps from 1,000,000
 * would otherwise hold the history's window of steps for the rest of the run.
 *
 * Each push names its run (collector.h): bmlaunch's run (BMT_RESTART) and the
 * rank's process. The collector follows one process per rank; a push of an
 * earlier run of the job or of an older process is refused (409), counted,
 * and changes nothing, and a newer process replaces the rank's state. The
 * window of steps is derived from the processes followed that report now, so
 * no late push of an old run sets it and no process that stopped holds it.
 *
 * After the ranks exit the job's gauges keep every rank's last figures (a
 * scrape after the end must see the final loss, not NaN), and the end itself
 * is exported: state, exit status and the first failed ranks (a bounded
 * number of series, whatever the world size).
 *
 * Scalars (bmt_report_scalar: "val_loss" and the program's own names) keep
 * each rank's last value per name, for at most BMT_SCALARS_MAX names per job:
 * a push that would add one more is refused whole (400), so a program cannot
 * grow the series without bound. The page's history of val_loss is a list of
 * (step, mean over the ranks that reported that step), each rank counted once
 * a point: a process that replaces a rank's and measures a step again
 * replaces the rank's value there.
 *
 * The page (web/index.html, embedded) sets every string of the status as
 * text, and is served with a Content-Security-Policy that runs only its own
 * script and style, by their SHA-256 taken from the embedded file when the
 * collector is created (page_csp): the page cannot drift from its policy.
 */
#include "collector.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/crypto.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bmt/device.h"
#include "bmt/monitor.h"
#include "common/metrics_json.h"
#include "common/prom.h"
#include "error.h"

#define SLOTS 32
#define HISTORY 600
#define EVENTS 50
#define MAX_ITEMS 4096
#define JOB_LABEL "job_id" /* not "job": Prometheus's own target label */
#define SCRAPES 8          /* recent /metrics requests kept for the linger */

extern const char collector_page[], collector_page_end[]; /* web_page.S */

/* Each rank's state in this run of the job. "Its process" is the one the
 * collector follows for the rank (has_run, run): the first that pushed in this
 * run, until a newer process of the rank (a later start) replaces it. Pushes
 * of an older process, or of an earlier run of the job, are refused (409). */
struct rank_state {
    bool seen, exited;
    bool has_run;      /* follows a process of this rank in this run */
    bool run_seen;     /* its process pushed a step */
    bool run_failed;   /* named among this run's failed ranks */
    bool host_of_run;  /* host is what its process said */
    metrics_run_t run; /* that process */
    uint64_t serial;   /* bumped with each process followed: tags its scalars */
    double last_push;  /* monotonic, any push */
    double run_push;   /* monotonic, its process's last push of a step; 0: none yet */
    double quiet_t;    /* monotonic: a process that replaced another and pushed no step
                        * yet is silent from here (0: from the run's first step) */
    int64_t top_step;  /* highest step added to the history in this run */
    /* Its process's first and highest step and when they came (monotonic):
     * the window of steps the job accepts (step_window). */
    int64_t p_first, p_top;
    double p_first_t, p_top_t;
    /* The counters never go down for the life of bmlaunch: the totals of the
     * previous processes of the rank (base) plus the highest of its process's
     * (a process counts from 0, and pushes may come out of order). */
    double tok_base, smp_base;
    uint64_t skip_base, drop_base;
    int64_t tok_run, smp_run, skip_run;
    uint64_t drop_run;    /* the highest "dropped" its process said */
    uint64_t refused_run; /* items of its process's pushes the collector refused (400) */
    char host[64];
    bmt_step_metrics_t m; /* the highest step of its latest process */
};

/* a + b, at most INT64_MAX: a counter that stays there rather than wrap (and
 * that JSON's integers and a double still read as a count). */
static uint64_t count_add(uint64_t a, uint64_t b)
{
    const uint64_t top = (uint64_t)INT64_MAX;
    return a >= top || b >= top - a ? top : a + b;
}

/* Items the rank's push plugin lost so far, as far as the collector knows:
 * what it said, or what was refused here, whichever is more (the plugin counts
 * refused items as dropped in its next push, if there is one). */
static uint64_t rank_dropped_run(const struct rank_state *s)
{
    return s->drop_run > s->refused_run ? s->drop_run : s->refused_run;
}

/* The rank's process is done with (a newer one replaces it, or the job
 * restarted): its totals join the base of the counters, and the rank has
 * pushed no step of the next one yet. Its last figures (m) stay, as the rank's
 * last figures, until the next process pushes a step. */
static void rank_retire(struct rank_state *s)
{
    s->tok_base += (double)s->tok_run;
    s->smp_base += (double)s->smp_run;
    s->skip_base = count_add(s->skip_base, (uint64_t)s->skip_run);
    s->drop_base = count_add(s->drop_base, rank_dropped_run(s));
    s->tok_run = s->smp_run = s->skip_run = 0;
    s->drop_run = s->refused_run = 0;
    s->run_push = 0;
    s->run_seen = s->has_run = s->host_of_run = false;
}

/* Rates of a set of ranks' steps: sums of throughput, the slowest step and
 * longest wait, and loss and MFU summed for a mean over the ranks that gave one
 * (rates_mean turns them into means, NaN when none did). */
struct rates {
    double tps, sps, fps, mfu, loss, step_s, comm_s;
    int fps_n, mfu_n, loss_n, step_n, comm_n;
};

static void rates_add(struct rates *x, const bmt_step_metrics_t *m)
{
    x->tps += m->tokens_per_s;
    x->sps += m->samples_per_s;
    if (isfinite(m->flops_per_s))
        x->fps += m->flops_per_s, x->fps_n++;
    if (isfinite(m->mfu))
        x->mfu += m->mfu, x->mfu_n++;
    if (isfinite(m->loss))
        x->loss += m->loss, x->loss_n++;
    x->step_s = m->step_time_s > x->step_s ? m->step_time_s : x->step_s;
    x->step_n++;
    if (isfinite(m->comm_wait_s)) {
        x->comm_s = m->comm_wait_s > x->comm_s ? m->comm_wait_s : x->comm_s;
        x->comm_n++;
    }
}

/* Figures no rank measured (FLOP/s, MFU, loss, communication wait: a Python
 * job has none of them unless it says; the step time when no rank is
 * reporting) are NaN, never a 0 that looks real. */
static void rates_mean(struct rates *x)
{
    x->step_s = x->step_n ? x->step_s : NAN;
    x->fps = x->fps_n ? x->fps : NAN;
    x->mfu = x->mfu_n ? x->mfu / x->mfu_n : NAN;
    x->loss = x->loss_n ? x->loss / x->loss_n : NAN;
    x->comm_s = x->comm_n ? x->comm_s : NAN;
}

struct acc { /* one step being assembled from the ranks' reports */
    int64_t step;
    int n;
    bool done;
    double time;
    struct rates r;
};

struct point {
    int64_t step;
    int ranks;
    double time, tps, fps, loss, mfu, step_s, comm_s;
};

struct event {
    int rank;
    metrics_event_t e;
};

/* Event kinds: the ranks' (bmt_event_kind_t), then bmlaunch's own. */
enum {
    EV_RANK_FAILED = BMT_EVENT_KIND_MAX + 1,
    EV_KINDS
};
static const char *const ev_names[EV_KINDS] = { "",     "checkpoint_saved", "restart", "abort",
                                                "note", "rank_failed" };

struct scalar { /* one name of the job's scalars */
    char name[BMT_SCALAR_NAME_MAX + 1];
    double *v;        /* per rank: its newest value */
    int64_t *step;    /* per rank: the step of that value; -1: none yet */
    uint64_t *serial; /* per rank: the process that gave it (rank_state.serial) */
};

struct vpoint { /* the job's val_loss at one step: a mean over the ranks that gave it */
    int64_t step;
    double sum;
    int n;
};

struct vgiven {   /* one of a rank's values in the recent val_loss points */
    int64_t step; /* -1: none */
    double value;
};

struct failure { /* a rank that exited with a non-zero code or by a signal */
    int rank, wait_status;
    bool aborted; /* called PMIx_Abort (bmt_abort): abort_status is its status */
    int abort_status;
};

/* The HTTP statuses of answers to pushes: these six from the start (so their
 * series exist at 0), others (libmicrohttpd's own 400 for a malformed request,
 * 411, 431, 500, 505, ...) added when first answered, up to NCODES in all. */
#define NCODES 16
static const int codes0[] = { 200, 400, 401, 404, 405, 409, 413 };

struct collector {
    pthread_mutex_t mu;
    char job_id[256], device[16], token[72];
    char csp[320]; /* the page's Content-Security-Policy (page_csp) */
    bmt_layout_t l;
    bool per_rank;
    double stale_s;
    struct rank_state *r;
    struct acc acc[SLOTS];
    bool rewound;  /* restarted: the next complete step may go back (a resume) */
    bool vrewound; /* restarted: so may the next val_loss point (the page's history) */
    struct point hist[HISTORY];
    int nhist;
    struct event ev[EVENTS];
    int nev, evnext;
    struct scalar sc[BMT_SCALARS_MAX];
    int nsc;
    struct vpoint vhist[HISTORY];
    int nvhist;
    /* per rank, the val_loss values it gave to the last SLOTS points (a ring
     * from vnext[r]): a process that replaces the rank's and measures a step
     * again replaces its value there, not adds a second (NULL: no val_loss) */
    struct vgiven *vgiven;
    int *vnext;
    uint64_t ev_count[EV_KINDS];
    int codes[NCODES], ncodes;
    uint64_t pushes[NCODES];
    uint64_t failures_total; /* failed ranks of every run (a counter) */
    int alive;
    bool ended;
    int exit_status;
    /* Over the steps added to the history (each once): their count and the
     * sums of their slowest step time and longest communication wait. */
    uint64_t steps_total;
    double step_seconds_total, comm_seconds_total;
    struct failure failed[COLLECTOR_FAILED_SHOWN]; /* the first of this run */
    int nfailed;                                   /* all of this run */
    int64_t restart;          /* bmlaunch's run (BMT_RESTART): pushes of earlier ones get 409 */
    uint64_t old_run_items;   /* items of the pushes refused with 409 (a counter) */
    bool run_started;         /* a step of this run was pushed, first at first_t */
    double first_t;           /* monotonic */
    double scrape_t[SCRAPES]; /* monotonic times of the last /metrics requests */
    uint64_t scrapes;
    bool scraped_after_end;
    char host[64]; /* ours: the host label of a rank that never said its own */
    bool verbose;
    int (*proc_state)(void *arg, int rank, char *buf, size_t len);
    void *proc_state_arg;
    double started;
    const char *kinds[BMT_MEM_KIND_COUNT];
    struct MHD_Daemon *d;
    int port;
    char *tls_cert, *tls_key; /* PEM, NULL: plain HTTP; kept while MHD serves */
};

/* Count an event and keep it in the ring of the last EVENTS (lock held). */
static void event_add(collector_t *c, int rank, const metrics_event_t *e)
{
    c->ev_count[e->kind]++;
    c->ev[c->evnext] = (struct event){ rank, *e };
    c->evnext = (c->evnext + 1) % EVENTS;
    if (c->nev < EVENTS)
        c->nev++;
}

/* Count an answer to a push by its HTTP status (lock held). */
static void count_code(collector_t *c, int code)
{
    for (int i = 0; i < c->ncodes; i++)
        if (c->codes[i] == code) {
            c->pushes[i]++;
            return;
        }
    if (c->ncodes < NCODES) {
        c->codes[c->ncodes] = code;
        c->pushes[c->ncodes++] = 1;
    }
}

static const char *failure_host(const collector_t *c, int rank);

/* Rank r failed (lock held): named among the first COLLECTOR_FAILED_SHOWN of
 * the run with a rank_failed event (detail: what happened), counted in the
 * run's failed ranks and in the counter of every run's. Once per rank and run. */
static void rank_failed(collector_t *c, int rank, const struct failure *f, const char *detail)
{
    if (c->r[rank].run_failed)
        return;
    c->r[rank].run_failed = true;
    if (c->nfailed < COLLECTOR_FAILED_SHOWN) {
        c->failed[c->nfailed] = *f;
        metrics_event_t e = { .kind = EV_RANK_FAILED, .time = metrics_unix_s() };
        e.step = c->r[rank].seen ? c->r[rank].m.step : 0;
        e.status = f->aborted ? f->abort_status : 0;
        snprintf(e.name, sizeof(e.name), "rank_failed");
        metrics_utf8_copy(e.detail, sizeof(e.detail), detail);
        event_add(c, rank, &e);
    }
    c->nfailed++;
    c->failures_total++;
}

/* Rank r called PMIx_Abort (bmt_abort) with status and msg (lock held): it is
 * the cause, so it is named before the ranks bmlaunch then ends with SIGTERM,
 * with its status rather than that signal. */
static void rank_aborted(collector_t *c, int rank, int status, const char *msg)
{
    char detail[sizeof(((metrics_event_t *)0)->detail)];
    snprintf(detail, sizeof(detail), "rank %d (on %s) called PMIx_Abort with status %d: %s", rank,
             failure_host(c, rank), status, msg && *msg ? msg : "(no message)");
    struct failure f = { .rank = rank, .aborted = true, .abort_status = status };
    rank_failed(c, rank, &f, detail);
}

/* The Content-Security-Policy of the page (len bytes of HTML) into out:
 * nothing loads or runs but its own <script> and <style> (by their SHA-256,
 * so a string that reached the DOM as HTML could run no script), and it
 * connects only to its own origin (/api/status). Each element is the first
 * line that is its opening tag alone (a comment may name the tags); the hash
 * covers its text, from that line's end to the closing tag. -1 when the page
 * lacks one of the two or out is too small (a build that embedded the wrong
 * file). */
static int page_csp(const char *page, size_t len, char *out, size_t outlen)
{
    static const char *const tags[2][2] = { { "\n<script>\n", "</script>" },
                                            { "\n<style>\n", "</style>" } };
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char hash[2][48]; /* base64 of 32 bytes: 44 characters */
    for (int t = 0; t < 2; t++) {
        const char *a = memmem(page, len, tags[t][0], strlen(tags[t][0]));
        if (a == NULL)
            return -1;
        a += strlen(tags[t][0]) - 1; /* the text opens with that line's end */
        const char *b = memmem(a, len - (size_t)(a - page), tags[t][1], strlen(tags[t][1]));
        unsigned char d[32];
        if (b == NULL || gnutls_hash_fast(GNUTLS_DIG_SHA256, a, (size_t)(b - a), d) < 0)
            return -1;
        char *h = hash[t];
        for (int i = 0; i < 33; i += 3) { /* 32 bytes: ten whole groups, then two bytes */
            unsigned v =
                (unsigned)d[i] << 16 | (unsigned)d[i + 1] << 8 | (i + 2 < 32 ? d[i + 2] : 0);
            *h++ = b64[v >> 18 & 63], *h++ = b64[v >> 12 & 63], *h++ = b64[v >> 6 & 63];
            *h++ = i + 2 < 32 ? b64[v & 63] : '=';
        }
        *h = '\0';
    }
    int n = snprintf(out, outlen,
                     "default-src 'none'; script-src 'sha256-%s'; style-src 'sha256-%s'; "
                     "connect-src 'self'; base-uri 'none'; form-action 'none'; "
                     "frame-ancestors 'none'",
                     hash[0], hash[1]);
    return n > 0 && (size_t)n < outlen ? 0 : -1;
}

collector_t *collector_create(const collector_opts_t *o, bmt_error_t *err)
{
    collector_t *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->r = calloc((size_t)o->layout->world, sizeof(*c->r))) == NULL) {
        free(c);
        errprintf(err, "out of memory for the metrics of %d ranks", o->layout->world);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    if (page_csp(collector_page, (size_t)(collector_page_end - collector_page) - 1, c->csp,
                 sizeof(c->csp)) < 0) {
        errprintf(err, "the built-in page (launcher/web/index.html) has no <script> or <style> to "
                       "hash for its Content-Security-Policy: rebuild bmlaunch");
        collector_destroy(c);
        return NULL;
    }
    snprintf(c->job_id, sizeof(c->job_id), "%s", o->job_id);
    snprintf(c->device, sizeof(c->device), "%s", o->device ? o->device : "cpu");
    c->l = *o->layout;
    c->per_rank = o->per_rank;
    c->stale_s = o->stale_s;
    c->verbose = o->verbose;
    c->proc_state = o->proc_state;
    c->proc_state_arg = o->proc_state_arg;
    if (gethostname(c->host, sizeof(c->host) - 1) != 0)
        snprintf(c->host, sizeof(c->host), "localhost");
    c->alive = c->l.world;
    c->started = metrics_unix_s();
    for (int k = 0; k < BMT_MEM_KIND_COUNT; k++)
        c->kinds[k] = bmt_mem_kind_name((bmt_mem_kind_t)k);
    for (int i = 0; i < SLOTS; i++)
        c->acc[i].step = -1;
    for (size_t i = 0; i < sizeof(codes0) / sizeof(codes0[0]); i++)
        c->codes[c->ncodes++] = codes0[i];
    if (o->tls_cert_pem && o->tls_key_pem &&
        ((c->tls_cert = strdup(o->tls_cert_pem)) == NULL ||
         (c->tls_key = strdup(o->tls_key_pem)) == NULL)) {
        errprintf(err, "out of memory for the metrics certificate");
        collector_destroy(c);
        return NULL;
    }
    if (o->token) {
        snprintf(c->token, sizeof(c->token), "%s", o->token);
    } else {
        unsigned char raw[32];
        if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
            errprintf(err, "getrandom: %s", strerror(errno));
            collector_destroy(c);
            return NULL;
        }
        for (int i = 0; i < 32; i++)
            snprintf(c->token + 2 * i, 3, "%02x", raw[i]);
    }
    return c;
}

const char *collector_token(const collector_t *c) { return c->token; }
bool collector_tls_supported(void) { return MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES; }
int collector_port(const collector_t *c) { return c->port; }

/* ------------------------------------------------------------ ingest */

static bool token_ok(const collector_t *c, const char *auth)
{
    /* RFC 7235: the scheme is case-insensitive, then one or more spaces.
     * RFC 9110 5.5: whitespace around a field value is no part of it, and
     * libmicrohttpd strips only the leading one. */
    if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0)
        return false;
    const char *t = auth + 7;
    while (*t == ' ')
        t++;
    size_t n = strlen(c->token), tn = strlen(t);
    while (tn > 0 && (t[tn - 1] == ' ' || t[tn - 1] == '\t'))
        tn--;
    if (tn != n)
        return false;
    unsigned char diff = 0; /* constant time in the token's length */
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(t[i] ^ c->token[i]);
    return diff == 0;
}

static void history_insert(collector_t *c, const struct acc *a)
{
    struct rates r = a->r;
    rates_mean(&r);
    struct point p = {
        .step = a->step,
        .ranks = a->n,
        .time = a->time,
        .tps = r.tps,
        .fps = r.fps,
        .loss = r.loss,
        .mfu = r.mfu,
        .step_s = r.step_s,
        .comm_s = r.comm_s,
    };
    /* The counters: every step once, whatever the scrapes see of the gauges. */
    c->steps_total++;
    if (isfinite(p.step_s))
        c->step_seconds_total += p.step_s;
    if (isfinite(p.comm_s))
        c->comm_seconds_total += p.comm_s;
    if (c->rewound) {
        /* The first complete step after a restart: a trainer that resumed from
         * a checkpoint repeats steps; the new run's figures replace the old. */
        while (c->nhist > 0 && c->hist[c->nhist - 1].step >= p.step)
            c->nhist--;
        c->rewound = false;
    }
    int i = c->nhist;
    while (i > 0 && c->hist[i - 1].step > p.step)
        i--;
    if (c->nhist == HISTORY) { /* drop the oldest */
        if (i == 0)
            return;
        memmove(c->hist, c->hist + 1, sizeof(struct point) * (size_t)(i - 1));
        i--;
    } else {
        memmove(c->hist + i + 1, c->hist + i, sizeof(struct point) * (size_t)(c->nhist - i));
        c->nhist++;
    }
    c->hist[i] = p;
}

static void history_add(collector_t *c, const bmt_step_metrics_t *m)
{
    struct acc *a = &c->acc[(uint64_t)m->step % SLOTS];
    if (a->step != m->step) {
        if (a->step > m->step)
            return; /* older than the window */
        if (a->n > 0 && !a->done)
            history_insert(c, a);
        memset(a, 0, sizeof(*a));
        a->step = m->step;
    }
    if (a->done)
        return;
    a->n++;
    a->time = m->time > a->time ? m->time : a->time;
    rates_add(&a->r, m);
    if (a->n == c->l.world) {
        history_insert(c, a);
        a->done = true;
    }
}

static int bad(char *why, size_t wlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t wlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wlen, fmt, ap);
    va_end(ap);
    return 400;
}

/* Whether step o (parsed into *m) holds possible values. JSON has no NaN or
 * infinity: null is read as NaN, which only the figures that may be unknown
 * (loss, FLOPs, MFU, communication wait, gradient norm, learning rate) may be;
 * a figure that is always known and missing counts as 0. Any finite double is
 * possible (a diverging run's loss of 1e31 is a figure to show, not a reason
 * to refuse the push). Returns 0, or -1 with what. */
static int step_check(const json_t *o, bmt_step_metrics_t *m, char *what, size_t len)
{
#define F(f, nullable, nonneg)                                                                     \
    {                                                                                              \
#f, offsetof(bmt_step_metrics_t, f), nullable, nonneg                                      \
    }
    static const struct {
        const char *name;
        size_t off;
        bool nullable, nonneg;
    } reals[] = {
        F(time, false, true),          F(step_time_s, false, true),
        F(loss, true, false),          F(tokens_per_s, false, true),
        F(samples_per_s, false, true), F(flops, true, true),
        F(flops_per_s, true, true),    F(mfu, true, true),
        F(comm_wait_s, true, true),    F(plugin_s, false, true),
        F(grad_norm, true, true),      F(lr, true, true),
    };
#undef F
    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++) {
        double *v = (double *)((char *)m + reals[i].off);
        if (isnan(*v) && !reals[i].nullable) {
            if (json_object_get(o, reals[i].name) != NULL)
                return snprintf(what, len,
                                "field \"%s\" must be a finite number: null (NaN or infinity) is "
                                "allowed only for loss, flops, flops_per_s, mfu, comm_wait_s, "
                                "grad_norm and lr",
                                reals[i].name),
                       -1;
            *v = 0; /* not given */
        }
        if (reals[i].nonneg && *v < 0)
            return snprintf(what, len, "field \"%s\" must not be negative (%g)", reals[i].name, *v),
                   -1;
    }
    const struct {
        const char *name;
        int64_t v;
    } counts[] = {
        { "step", m->step },
        { "tokens", m->tokens },
        { "samples", m->samples },
        { "tokens_total", m->tokens_total },
        { "samples_total", m->samples_total },
        { "skipped_total", m->skipped_total },
        { "microbatches", m->microbatches },
        { "params", m->params },
    };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        if (counts[i].v < 0)
            return snprintf(what, len, "field \"%s\" is a count and must not be negative (%lld)",
                            counts[i].name, (long long)counts[i].v),
                   -1;
    if (m->skipped != 0 && m->skipped != 1)
        return snprintf(what, len, "field \"skipped\" must be 0 or 1 (%d)", (int)m->skipped), -1;
    if (m->tokens_total < m->tokens || m->samples_total < m->samples ||
        m->skipped_total < m->skipped)
        return snprintf(what, len,
                        "a total is less than the step's own count (tokens_total %lld, tokens "
                        "%lld; samples_total %lld, samples %lld; skipped_total %lld, skipped %d)",
                        (long long)m->tokens_total, (long long)m->tokens,
                        (long long)m->samples_total, (long long)m->samples,
                        (long long)m->skipped_total, (int)m->skipped),
               -1;
    return 0;
}

static int scalar_check(const metrics_scalar_t *x, char *what, size_t len)
{
    if (!bmt_scalar_name_ok(x->name))
        return snprintf(what, len,
                        "name \"%s\" must be a lower-case letter then lower-case letters, digits "
                        "and '_', at most %d bytes",
                        x->name, BMT_SCALAR_NAME_MAX),
               -1;
    if (x->step < 0)
        return snprintf(what, len, "field \"step\" must not be negative (%lld)",
                        (long long)x->step),
               -1;
    return 0;
}

/* The job's scalar called name, or -1 (lock held). */
static int scalar_find(const collector_t *c, const char *name)
{
    for (int i = 0; i < c->nsc; i++)
        if (strcmp(c->sc[i].name, name) == 0)
            return i;
    return -1;
}

/* Whether the names of xs, with the job's, are at most BMT_SCALARS_MAX (lock held). */
static int scalar_names_fit(const collector_t *c, const metrics_scalar_t *xs, size_t n, char *why,
                            size_t wlen)
{
    int more = 0;
    for (size_t i = 0; i < n; i++) {
        bool known = scalar_find(c, xs[i].name) >= 0;
        for (size_t j = 0; j < i && !known; j++)
            known = strcmp(xs[j].name, xs[i].name) == 0;
        if (!known && c->nsc + ++more > BMT_SCALARS_MAX)
            return bad(why, wlen,
                       "scalars: \"%s\" would be one name too many: a job has at most %d "
                       "scalar names (it has %d)",
                       xs[i].name, BMT_SCALARS_MAX, c->nsc),
                   -1;
    }
    return 0;
}

/* Keep rank r's scalar, and val_loss's point of the page's history (lock held;
 * the names fit). The rank's value is its process's newest by step: a value
 * of an older step that comes late changes nothing (neither the value nor the
 * history); one of the same step replaces the value (the history has the
 * rank's first at that step); a newer process's replaces any of an older one. */
static void scalar_add(collector_t *c, int r, const metrics_scalar_t *x)
{
    int i = scalar_find(c, x->name);
    if (i < 0) {
        struct scalar *s = &c->sc[c->nsc];
        s->v = malloc((size_t)c->l.world * sizeof(*s->v));
        s->step = malloc((size_t)c->l.world * sizeof(*s->step));
        s->serial = malloc((size_t)c->l.world * sizeof(*s->serial));
        if (s->v == NULL || s->step == NULL || s->serial == NULL) {
            free(s->v), free(s->step), free(s->serial);
            s->v = NULL, s->step = NULL, s->serial = NULL;
            return;
        }
        snprintf(s->name, sizeof(s->name), "%s", x->name);
        for (int k = 0; k < c->l.world; k++)
            s->v[k] = NAN, s->step[k] = -1, s->serial[k] = 0;
        i = c->nsc++;
    }
    struct scalar *s = &c->sc[i];
    bool same = s->step[r] >= 0 && s->serial[r] == c->r[r].serial;
    if (same && x->step < s->step[r])
        return; /* late and older than the rank's newest */
    bool again = same && x->step == s->step[r];
    s->v[r] = x->value;
    s->step[r] = x->step;
    s->serial[r] = c->r[r].serial;
    if (again || strcmp(x->name, "val_loss") != 0)
        return;
    if (c->vgiven == NULL) {
        c->vgiven = malloc((size_t)c->l.world * SLOTS * sizeof(*c->vgiven));
        c->vnext = calloc((size_t)c->l.world, sizeof(*c->vnext));
        if (c->vgiven == NULL || c->vnext == NULL) {
            free(c->vgiven), free(c->vnext);
            c->vgiven = NULL, c->vnext = NULL;
            return; /* the value is kept; the history misses it */
        }
        for (size_t k = 0; k < (size_t)c->l.world * SLOTS; k++)
            c->vgiven[k].step = -1;
    }
    if (c->vrewound) {
        /* The first val_loss after a restart: a run that resumed from a
         * checkpoint measures its steps again; its values replace the old
         * run's, never average with them (as the step history does). */
        while (c->nvhist > 0 && c->vhist[c->nvhist - 1].step >= x->step)
            c->nvhist--;
        for (size_t k = 0; k < (size_t)c->l.world * SLOTS; k++)
            if (c->vgiven[k].step >= x->step)
                c->vgiven[k].step = -1;
        c->vrewound = false;
    }
    struct vgiven *mine = c->vgiven + (size_t)r * SLOTS, *had = NULL;
    for (int k = 0; k < SLOTS; k++)
        if (mine[k].step == x->step)
            had = &mine[k];
    struct vpoint *pt = NULL; /* the recent point of that step, if any */
    for (int k = c->nvhist - 1; k >= 0 && k >= c->nvhist - SLOTS && pt == NULL; k--)
        if (c->vhist[k].step == x->step)
            pt = &c->vhist[k];
    if (had) { /* the rank's again, from a process that replaced it */
        if (pt)
            pt->sum += x->value - had->value;
        had->value = x->value;
        return;
    }
    mine[c->vnext[r]] = (struct vgiven){ x->step, x->value };
    c->vnext[r] = (c->vnext[r] + 1) % SLOTS;
    if (pt) { /* another rank's value of it */
        pt->sum += x->value, pt->n++;
        return;
    }
    if (c->nvhist == HISTORY) {
        memmove(c->vhist, c->vhist + 1, (HISTORY - 1) * sizeof(c->vhist[0]));
        c->nvhist--;
    }
    c->vhist[c->nvhist++] = (struct vpoint){ x->step, x->value, 1 };
}

/* Scalar i over the ranks that gave it: the mean of their last values (NaN
 * when one is not finite: a diverged rank must show) and the highest step. */
static double scalar_mean(const collector_t *c, int i, int64_t *step)
{
    double sum = 0;
    int n = 0;
    *step = -1;
    for (int r = 0; r < c->l.world; r++)
        if (c->sc[i].step[r] >= 0) {
            sum += c->sc[i].v[r], n++;
            *step = c->sc[i].step[r] > *step ? c->sc[i].step[r] : *step;
        }
    return n ? sum / n : NAN;
}

/* The window of steps a push of rank r may bring now (lock held; renewing:
 * the push comes from a process that replaces the rank's). It follows the
 * ranks whose process pushed a step within the stale window, r's own unless
 * it is being replaced: *lead is their highest step, and a push may be *ahead
 * steps above it and *behind below it (the leading process's step rate over
 * at least a second, times twice the time since that step, or since r's last
 * step, plus COLLECTOR_STEP_SLACK). False when no rank anchors it (any step is
 * accepted): so neither a process that stopped pushing nor one that a newer
 * process replaced (nor a run before a restart) holds the window. */
static bool step_window(const collector_t *c, int r, bool renewing, double stale, double now,
                        int64_t *lead, double *ahead, double *behind)
{
    const struct rank_state *top = NULL;
    for (int k = 0; k < c->l.world; k++) {
        const struct rank_state *s = &c->r[k];
        if (!s->run_seen || now - s->run_push > stale || (k == r && renewing))
            continue;
        if (top == NULL || s->p_top > top->p_top)
            top = s;
    }
    if (top == NULL)
        return false;
    /* over at least a second: two steps a microsecond apart are no rate */
    double span = top->p_top_t - top->p_first_t;
    double rate = (double)(top->p_top - top->p_first) / (span > 1 ? span : 1);
    const struct rank_state *rs = &c->r[r];
    double since_rank = now - (rs->run_push > 0 && !renewing ? rs->run_push : c->first_t);
    *lead = top->p_top;
    *ahead = COLLECTOR_STEP_SLACK + 2 * rate * (now - top->p_top_t);
    *behind = COLLECTOR_STEP_SLACK + 2 * rate * since_rank;
    return true;
}

/* Rank r's process: the run its push came from, against the one the
 * collector follows (lock held). 0: that one (or the first of this run, or a
 * newer one: *renewing), else the HTTP status with why: 409 for an earlier run
 * of the job or an older process of the rank, 400 for a run bmlaunch has not
 * started. */
static int run_check(const collector_t *c, int r, const metrics_run_t *run, bool *renewing,
                     char *why, size_t wlen)
{
    const struct rank_state *rs = &c->r[r];
    *renewing = false;
    if (run->restart > c->restart)
        return bad(why, wlen,
                   "run: \"restart\" %lld is a run bmlaunch has not started (it started run %lld "
                   "last: BMT_RESTART=%lld)",
                   (long long)run->restart, (long long)c->restart, (long long)c->restart);
    if (run->restart < c->restart) {
        snprintf(why, wlen,
                 "run: this push comes from run %lld of the job (BMT_RESTART=%lld), and bmlaunch "
                 "has restarted the job since: the collector follows run %lld, and refuses a "
                 "late push of an earlier run rather than merge it",
                 (long long)run->restart, (long long)run->restart, (long long)c->restart);
        return 409;
    }
    if (!rs->has_run)
        return 0;
    int cmp = metrics_run_cmp(run, &rs->run);
    if (cmp < 0) {
        snprintf(why, wlen,
                 "run: rank %d's process %s (started at %.6f) is older than the one the "
                 "collector follows for the rank (%s, started at %.6f): a newer process of rank "
                 "%d pushes now, and the older one's pushes are refused rather than merged",
                 r, run->id, run->start, rs->run.id, rs->run.start, r);
        return 409;
    }
    *renewing = cmp > 0;
    return 0;
}

static double stale_after(const collector_t *c);

/* A push of an earlier run, or of an older process of the rank, refused with
 * 409 (lock held): its n items are lost for good (that process's own count of
 * them never arrives), so they count in the rank's dropped ones and in
 * bmt_push_old_run_items_total. */
static void count_old_run(collector_t *c, int r, uint64_t n)
{
    c->r[r].drop_base = count_add(c->r[r].drop_base, n);
    c->old_run_items = count_add(c->old_run_items, n);
}

/* A newer process of rank r replaces the one the collector followed (lock
 * held): an event says so (rank r, kind restart), the old process's totals join
 * the counters' base, and its figures stay the rank's last until the new one
 * pushes a step. */
static void rank_renew(collector_t *c, int r, const metrics_run_t *run, double now, int64_t step)
{
    struct rank_state *rs = &c->r[r];
    metrics_event_t e = { .kind = BMT_EVENT_RESTART, .time = metrics_unix_s(), .step = step };
    snprintf(e.name, sizeof(e.name), "restart");
    snprintf(e.detail, sizeof(e.detail),
             "collector: rank %d (on %s) has a newer process (run %s, started %.3f s after run "
             "%s): its figures replace the older one's, whose pushes are refused from now on",
             r, failure_host(c, r), run->id, run->start - rs->run.start, rs->run.id);
    event_add(c, r, &e);
    rank_retire(rs);
    rs->quiet_t = now;
}

static int ingest_json(collector_t *c, const json_t *doc, char *why, size_t wlen)
{
    if (!json_is_object(doc))
        return bad(why, wlen, "the body must be a JSON object");
    const json_t *v = json_object_get(doc, "version"), *job = json_object_get(doc, "job"),
                 *rank = json_object_get(doc, "rank"), *steps = json_object_get(doc, "steps"),
                 *events = json_object_get(doc, "events"),
                 *scalars = json_object_get(doc, "scalars"),
                 *dropped = json_object_get(doc, "dropped"), *host = json_object_get(doc, "host"),
                 *jrun = json_object_get(doc, "run");
    if (json_is_integer(v) && json_integer_value(v) == 1)
        return bad(why, wlen,
                   "\"version\" 1 is the push protocol without run identities: this bmlaunch "
                   "takes version %d, whose \"run\" tells a late push of an earlier run from the "
                   "current one's; the client (libbmt's push plugin, python/bmt) is older than "
                   "bmlaunch: use the ones built with it",
                   METRICS_PROTOCOL_VERSION);
    if (!json_is_integer(v) || json_integer_value(v) != METRICS_PROTOCOL_VERSION)
        return bad(why, wlen, "\"version\" must be %d", METRICS_PROTOCOL_VERSION);
    /* A member the collector does not know ("step" for "steps") would be
     * accepted and ignored: the push said something that was never shown. */
    static const char *const members[] = { "version", "job",         "rank",       "run",
                                           "host",    "device_name", "peak_flops", "dropped",
                                           "steps",   "events",      "scalars" };
    for (void *it = json_object_iter((json_t *)doc); it;
         it = json_object_iter_next((json_t *)doc, it)) {
        const char *key = json_object_iter_key(it);
        size_t k = 0;
        while (k < sizeof(members) / sizeof(members[0]) && strcmp(key, members[k]) != 0)
            k++;
        if (k == sizeof(members) / sizeof(members[0]))
            return bad(why, wlen,
                       "unknown member \"%.48s\" (a push has version, job, rank, run, host, "
                       "device_name, peak_flops, dropped, steps, events and scalars)",
                       key);
    }
    if (!json_is_string(job) || strcmp(json_string_value(job), c->job_id) != 0)
        return bad(why, wlen, "\"job\" must be this job's id (%.200s)", c->job_id);
    if (!json_is_integer(rank) || json_integer_value(rank) < 0 ||
        json_integer_value(rank) >= c->l.world)
        return bad(why, wlen, "\"rank\" must be an integer in [0, %d)", c->l.world);
    char what[200];
    metrics_run_t run;
    if (jrun == NULL)
        return bad(why, wlen,
                   "\"run\" is missing: every push names the process it comes from, "
                   "{\"restart\": BMT_RESTART, \"start\": unix seconds, \"id\": %d hex digits} "
                   "(docs/metrics.md, push)",
                   METRICS_RUN_ID_LEN);
    if (metrics_run_parse(jrun, &run, what, sizeof(what)) < 0)
        return bad(why, wlen, "%s", what);
    if ((steps && !json_is_array(steps)) || (events && !json_is_array(events)) ||
        (scalars && !json_is_array(scalars)))
        return bad(why, wlen, "\"steps\", \"events\" and \"scalars\" must be arrays");
    if (dropped && (!json_is_integer(dropped) || json_integer_value(dropped) < 0 ||
                    (uint64_t)json_integer_value(dropped) > METRICS_DROPPED_MAX))
        return bad(why, wlen, "\"dropped\" must be a count from 0 to 2^53 (%llu)",
                   (unsigned long long)METRICS_DROPPED_MAX);
    if (host && !json_is_string(host))
        return bad(why, wlen, "\"host\" must be a string");
    size_t ns = steps ? json_array_size(steps) : 0, ne = events ? json_array_size(events) : 0,
           nx = scalars ? json_array_size(scalars) : 0;
    if (ns + ne + nx > MAX_ITEMS)
        return bad(why, wlen, "at most %d steps, events and scalars in one push", MAX_ITEMS);
    bmt_step_metrics_t *ms = ns ? calloc(ns, sizeof(*ms)) : NULL;
    metrics_event_t *es = ne ? calloc(ne, sizeof(*es)) : NULL;
    metrics_scalar_t *xs = nx ? calloc(nx, sizeof(*xs)) : NULL;
    int code = 200;
    if ((ns && ms == NULL) || (ne && es == NULL) || (nx && xs == NULL)) {
        code = bad(why, wlen, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < ns; i++)
        if (metrics_step_parse(json_array_get(steps, i), &ms[i], c->kinds, BMT_MEM_KIND_COUNT, what,
                               sizeof(what)) < 0 ||
            step_check(json_array_get(steps, i), &ms[i], what, sizeof(what)) < 0) {
            code = bad(why, wlen, "steps[%zu]: %s", i, what);
            goto out;
        }
    for (size_t i = 0; i < ne; i++) {
        if (metrics_event_parse(json_array_get(events, i), &es[i], what, sizeof(what)) < 0) {
            code = bad(why, wlen, "events[%zu]: %s", i, what);
            goto out;
        }
        if (es[i].step < 0) {
            code = bad(why, wlen, "events[%zu]: field \"step\" must not be negative (%lld)", i,
                       (long long)es[i].step);
            goto out;
        }
    }
    for (size_t i = 0; i < nx; i++)
        if (metrics_scalar_parse(json_array_get(scalars, i), &xs[i], what, sizeof(what)) < 0 ||
            scalar_check(&xs[i], what, sizeof(what)) < 0) {
            code = bad(why, wlen, "scalars[%zu]: %s", i, what);
            goto out;
        }
    int r = (int)json_integer_value(rank);
    char hostname[sizeof(c->r[r].host)] = "";
    if (host)
        metrics_utf8_copy(hostname, sizeof(hostname), json_string_value(host));
    pthread_mutex_lock(&c->mu);
    struct rank_state *rs = &c->r[r];
    double now = metrics_mono_s(), stale = stale_after(c);
    bool renewing;
    code = run_check(c, r, &run, &renewing, why, wlen);
    if (code == 409)
        count_old_run(c, r, ns + ne + nx);
    if (code != 0)
        goto unlock;
    code = 200;
    /* A process's host never changes: another host under the same run is
     * another process that took its identity. */
    if (host && rs->host_of_run && !renewing && strcmp(hostname, rs->host) != 0) {
        code = bad(why, wlen,
                   "\"host\" \"%.64s\" is not the host rank %d's process %s pushed from so far "
                   "(\"%s\"): a process's host never changes",
                   hostname, r, run.id, rs->host);
        goto unlock;
    }
    /* Every step near the job's, checked as if the earlier ones were applied. */
    int64_t lead = 0;
    double ahead = 0, behind = 0;
    bool anchored = step_window(c, r, renewing, stale, now, &lead, &ahead, &behind);
    for (size_t i = 0; i < ns; i++) {
        double d = (double)ms[i].step - (double)lead;
        if (anchored && (d > ahead || -d > behind)) {
            code = bad(why, wlen,
                       "steps[%zu]: step %lld is far from the job's (its highest step so far is "
                       "%lld; a push may be at most %.0f steps ahead of it and %.0f behind)",
                       i, (long long)ms[i].step, (long long)lead, ahead, behind);
            goto unlock;
        }
        if (!anchored) /* the push's first step anchors the rest of it */
            ahead = behind = COLLECTOR_STEP_SLACK;
        if (!anchored || ms[i].step > lead)
            lead = ms[i].step;
        anchored = true;
    }
    if (scalar_names_fit(c, xs, nx, why, wlen) < 0) {
        code = 400;
        goto unlock;
    }
    /* Applied from here on: the push is good. */
    if (renewing)
        rank_renew(c, r, &run, now, ns ? ms[0].step : rs->m.step);
    if (!rs->has_run) {
        rs->has_run = true;
        rs->run = run;
        rs->serial++;
    }
    if (ns > 0 && !c->run_started) {
        c->run_started = true;
        c->first_t = now;
    }
    rs->last_push = now;
    if (ns > 0)
        rs->run_push = now;
    if (dropped && (uint64_t)json_integer_value(dropped) > rs->drop_run)
        rs->drop_run = (uint64_t)json_integer_value(dropped);
    if (host) {
        snprintf(rs->host, sizeof(rs->host), "%s", hostname);
        rs->host_of_run = true;
    }
    for (size_t i = 0; i < ns; i++) {
        if (!rs->run_seen) {
            rs->p_first = rs->p_top = ms[i].step;
            rs->p_first_t = rs->p_top_t = now;
        } else if (ms[i].step > rs->p_top) {
            rs->p_top = ms[i].step;
            rs->p_top_t = now;
        }
        /* A push held back may bring an older step after a newer one: the
         * rank's figures stay its newest step's, and its totals never fall. */
        if (!rs->run_seen || ms[i].step >= rs->m.step)
            rs->m = ms[i];
        rs->seen = rs->run_seen = true;
        rs->tok_run = ms[i].tokens_total > rs->tok_run ? ms[i].tokens_total : rs->tok_run;
        rs->smp_run = ms[i].samples_total > rs->smp_run ? ms[i].samples_total : rs->smp_run;
        rs->skip_run = ms[i].skipped_total > rs->skip_run ? ms[i].skipped_total : rs->skip_run;
        if (!rs->top_step || ms[i].step > rs->top_step) {
            history_add(c, &ms[i]);
            rs->top_step = ms[i].step;
        }
    }
    for (size_t i = 0; i < ne; i++) {
        event_add(c, r, &es[i]);
        /* bmt_abort says so before it calls PMIx_Abort: the rank that aborted
         * is the job's culprit, whatever signal bmlaunch ends it with. */
        if (es[i].kind == BMT_EVENT_ABORT)
            rank_aborted(c, r, es[i].status, es[i].detail);
    }
    for (size_t i = 0; i < nx; i++)
        scalar_add(c, r, &xs[i]);
    count_code(c, 200);
unlock:
    pthread_mutex_unlock(&c->mu);
out:
    free(ms);
    free(es);
    free(xs);
    return code;
}

void collector_count(collector_t *c, int code)
{
    pthread_mutex_lock(&c->mu);
    count_code(c, code);
    pthread_mutex_unlock(&c->mu);
}

/* A refused push (400) of a known rank: its items are lost (the plugin drops
 * them), so they count in bmt_push_dropped_total now, not only when (if ever)
 * the rank's next push says so: in the refused items of the process the
 * collector follows (which says them as dropped later: the higher of the two
 * counts), or for good when the push names an older process or run (which
 * never will). A newer process, not followed yet, counts them itself in the
 * "dropped" of its next push. */
static void count_refused(collector_t *c, const json_t *doc)
{
    const json_t *job = json_object_get(doc, "job"), *rank = json_object_get(doc, "rank");
    if (!json_is_string(job) || strcmp(json_string_value(job), c->job_id) != 0 ||
        !json_is_integer(rank) || json_integer_value(rank) < 0 ||
        json_integer_value(rank) >= c->l.world)
        return;
    size_t n = 0;
    static const char *const arrays[] = { "steps", "events", "scalars" };
    for (int i = 0; i < 3; i++)
        n += json_array_size(json_object_get(doc, arrays[i])); /* 0 when not an array */
    metrics_run_t run;
    char what[200];
    bool known = metrics_run_parse(json_object_get(doc, "run"), &run, what, sizeof(what)) == 0;
    pthread_mutex_lock(&c->mu);
    struct rank_state *rs = &c->r[json_integer_value(rank)];
    int cmp = known && rs->has_run ? metrics_run_cmp(&run, &rs->run) : 0;
    if (known && (run.restart < c->restart || (run.restart == c->restart && cmp < 0)))
        rs->drop_base = count_add(rs->drop_base, n);
    else if (!known || (run.restart == c->restart && cmp == 0))
        rs->refused_run = count_add(rs->refused_run, n);
    pthread_mutex_unlock(&c->mu);
}

int collector_ingest(collector_t *c, const char *authorization, const char *body, size_t len,
                     char *why, size_t wlen)
{
    if (!token_ok(c, authorization)) {
        snprintf(why, wlen,
                 "missing or wrong bearer token (Authorization: Bearer <the job's "
                 "BMT_METRICS_TOKEN>)");
        collector_count(c, 401);
        return 401;
    }
    json_error_t je;
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    int code;
    if (doc == NULL)
        code =
            bad(why, wlen, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
    else
        code = ingest_json(c, doc, why, wlen);
    if (code == 400 && doc)
        count_refused(c, doc);
    json_decref(doc);
    if (code != 200)
        collector_count(c, code);
    return code;
}

static const char *failure_host(const collector_t *c, int rank);

void collector_rank_exited(collector_t *c, int rank, int wait_status, int ended_by)
{
    if (c == NULL || rank < 0 || rank >= c->l.world)
        return;
    pthread_mutex_lock(&c->mu);
    if (!c->r[rank].exited) {
        c->r[rank].exited = true;
        c->alive--;
        /* A rank bmlaunch ended (its SIGTERM after another's failure, its
         * SIGKILL after the grace, a signal it forwarded) did not fail. */
        if (ended_by == 0 && (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0)) {
            char detail[sizeof(((metrics_event_t *)0)->detail)];
            if (WIFEXITED(wait_status))
                snprintf(detail, sizeof(detail), "rank %d (on %s) exited with code %d", rank,
                         failure_host(c, rank), WEXITSTATUS(wait_status));
            else
                snprintf(detail, sizeof(detail), "rank %d (on %s) was killed by signal %d (SIG%s)",
                         rank, failure_host(c, rank), WTERMSIG(wait_status),
                         sigabbrev_np(WTERMSIG(wait_status)) ? sigabbrev_np(WTERMSIG(wait_status))
                                                             : "?");
            struct failure f = { .rank = rank, .wait_status = wait_status };
            rank_failed(c, rank, &f, detail); /* not again for a rank that aborted */
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void collector_rank_host(collector_t *c, int rank, const char *host)
{
    if (c == NULL || host == NULL || *host == '\0' || rank < 0 || rank >= c->l.world)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->r[rank].host[0] == '\0') /* what the rank pushed prevails */
        metrics_utf8_copy(c->r[rank].host, sizeof(c->r[rank].host), host);
    pthread_mutex_unlock(&c->mu);
}

void collector_rank_aborted(collector_t *c, int rank, int status, const char *msg)
{
    if (c == NULL || rank < 0 || rank >= c->l.world)
        return;
    pthread_mutex_lock(&c->mu);
    rank_aborted(c, rank, status, msg);
    pthread_mutex_unlock(&c->mu);
}

void collector_job_ended(collector_t *c, int exit_status)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    c->ended = true;
    c->alive = 0;
    c->exit_status = exit_status;
    pthread_mutex_unlock(&c->mu);
}

void collector_job_restarted(collector_t *c, int restart, const char *detail)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    metrics_event_t e = { .kind = BMT_EVENT_RESTART, .time = metrics_unix_s() };
    for (int r = 0; r < c->l.world; r++) {
        c->r[r].exited = false;
        e.step = c->r[r].top_step > e.step ? c->r[r].top_step : e.step;
    }
    /* The next run starts its steps anew (from 1, or from a checkpoint), and
     * its processes their totals from 0: the counters keep this run's as a
     * base. Its processes' pushes say restart (BMT_RESTART): this run's late
     * ones are refused from now on (409), whatever step they bring. */
    for (int r = 0; r < c->l.world; r++) {
        struct rank_state *s = &c->r[r];
        rank_retire(s);
        s->top_step = 0, s->quiet_t = 0;
        s->run_failed = false;
    }
    c->restart = restart > c->restart ? restart : c->restart + 1;
    memset(c->acc, 0, sizeof(c->acc));
    c->run_started = false; /* it may resume from a checkpoint of any step */
    c->nfailed = 0;         /* this run's; bmt_ranks_failed_total keeps every run's */
    c->rewound = c->vrewound = true;
    c->alive = c->l.world;
    snprintf(e.name, sizeof(e.name), "restart");
    snprintf(e.detail, sizeof(e.detail), "bmlaunch: restart %d after %s", restart,
             detail ? detail : "a failure");
    event_add(c, -1, &e); /* rank -1: bmlaunch itself */
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ aggregation */

/* Figures over a set of ranks' latest metrics. */
typedef struct agg {
    int seen, reporting;
    int64_t step_min, step_max, skipped, params;
    struct rates r; /* over the reporting ranks (the loss: see aggregate) */
    double grad_norm, lr;
    double tokens, samples; /* totals (counters) */
    uint64_t dropped;
    int mem_n; /* ranks whose last step measured memory (0: absent / NaN) */
    uint64_t mem[BMT_MEM_KIND_COUNT], mem_peak[BMT_MEM_KIND_COUNT], mem_total;
} agg_t;

/* Whether rank s counts as reporting: running, and it pushed a step of this
 * run within the stale window. The one definition for the rates and for
 * stale_ranks (a running rank that has pushed a step and is not reporting is
 * stale; scalars and events alone do not keep a rank reporting). */
static bool rank_reporting(const collector_t *c, const struct rank_state *s, double stale,
                           double now)
{
    return !s->exited && !c->ended && s->run_push > 0 && now - s->run_push <= stale;
}

double collector_stale_default(double slowest_step_s)
{
    double s = COLLECTOR_STALE_STEPS * slowest_step_s;
    return isfinite(s) && s > COLLECTOR_STALE_MIN_S ? s : COLLECTOR_STALE_MIN_S;
}

static double stale_after(const collector_t *c)
{
    if (c->stale_s > 0)
        return c->stale_s;
    double worst = 0;
    for (int r = 0; r < c->l.world; r++)
        if (c->r[r].seen && c->r[r].m.step_time_s > worst)
            worst = c->r[r].m.step_time_s;
    return collector_stale_default(worst);
}

/* The stale ranks (collector.h), the first max of them into out with the
 * seconds since their last push (or since the run's first); returns how many
 * there are. */
static int stale_ranks(const collector_t *c, double stale, double now, int *out, double *age,
                       int max)
{
    if (c->ended || !c->run_started)
        return 0;
    int n = 0;
    for (int r = 0; r < c->l.world; r++) {
        const struct rank_state *s = &c->r[r];
        if (s->exited)
            continue;
        double quiet = s->quiet_t > c->first_t ? s->quiet_t : c->first_t;
        double since = now - (s->run_push > 0 ? s->run_push : quiet);
        if (rank_reporting(c, s, stale, now) || since <= stale)
            continue;
        if (n < max)
            out[n] = r, age[n] = since;
        n++;
    }
    return n;
}

/* The process state of rank r as the launcher sees it, or "unknown". */
static void proc_state(const collector_t *c, int r, char *buf, size_t len)
{
    if (c->proc_state == NULL || c->proc_state(c->proc_state_arg, r, buf, len) < 0)
        snprintf(buf, len, "unknown");
}

/* The figures of ranks [first, first + n). Counters: every run's totals.
 * Rates and times: over the reporting ranks (every rank's last figures once
 * the job is over). The loss: the mean of the reporting ranks' finite losses;
 * when none is reporting (a hung job: all stale), of every rank's last loss,
 * so the loss never turns NaN because ranks stopped pushing, only because
 * they pushed a NaN. The step: the lowest of this run's steps, a rank that has
 * not reported one counting as 0. */
static void aggregate(const collector_t *c, int first, int n, double stale, double now, agg_t *a)
{
    memset(a, 0, sizeof(*a));
    a->grad_norm = a->lr = NAN;
    int64_t lead = -1;
    bool over = c->ended || c->alive == 0;
    struct rates all = { 0 }; /* every rank's last figures: the loss's fallback */
    for (int r = first; r < first + n; r++) {
        const struct rank_state *s = &c->r[r];
        int64_t step = s->run_seen ? s->m.step : 0;
        if (r == first || step < a->step_min)
            a->step_min = step;
        a->tokens += s->tok_base + (double)s->tok_run;
        a->samples += s->smp_base + (double)s->smp_run;
        a->dropped = count_add(a->dropped, count_add(s->drop_base, rank_dropped_run(s)));
        int64_t skipped = (int64_t)count_add(s->skip_base, (uint64_t)s->skip_run);
        a->skipped = skipped > a->skipped ? skipped : a->skipped;
        if (!s->seen)
            continue;
        const bmt_step_metrics_t *m = &s->m;
        a->seen++;
        rates_add(&all, m);
        a->params = m->params > a->params ? m->params : a->params;
        if (m->step > a->step_max)
            a->step_max = m->step;
        if (m->step > lead) {
            lead = m->step;
            a->grad_norm = m->grad_norm;
            a->lr = m->lr;
        }
        uint64_t total = 0;
        a->mem_n += m->mem_kinds > 0;
        for (int k = 0; k < BMT_MEM_KIND_COUNT && k < m->mem_kinds; k++) {
            a->mem[k] = m->mem_current[k] > a->mem[k] ? m->mem_current[k] : a->mem[k];
            a->mem_peak[k] = m->mem_peak[k] > a->mem_peak[k] ? m->mem_peak[k] : a->mem_peak[k];
            total += m->mem_current[k];
        }
        a->mem_total = total > a->mem_total ? total : a->mem_total;
        if (!rank_reporting(c, s, stale, now)) {
            /* Rates count only while a rank reports; once the job's ranks have
             * all exited, every rank's last figures (the job's final ones). */
            if (over)
                rates_add(&a->r, m);
            continue;
        }
        a->reporting++;
        rates_add(&a->r, m);
    }
    if (a->reporting == 0 && !over) { /* nobody reports: the last losses stand */
        a->r.loss = all.loss;
        a->r.loss_n = all.loss_n;
    }
    rates_mean(&a->r);
}

/* ------------------------------------------------------------ /metrics */

typedef struct fam {
    const char *name, *type, *help;
    size_t off; /* double field of agg_t, or (size_t)-1: special */
} fam_t;

#define AGG(f) offsetof(agg_t, f)

static const fam_t job_fams[] = {
    { "tokens_per_second", "gauge", "tokens per second of the reporting ranks, summed",
      AGG(r.tps) },
    { "samples_per_second", "gauge", "samples per second of the reporting ranks, summed",
      AGG(r.sps) },
    { "model_flops_per_second", "gauge", "achieved model FLOP/s of the reporting ranks, summed",
      AGG(r.fps) },
    { "mfu_ratio", "gauge", "model FLOP utilization (0..1), mean over the reporting ranks",
      AGG(r.mfu) },
    { "step_duration_seconds", "gauge", "wall time of the last step, slowest reporting rank",
      AGG(r.step_s) },
    { "comm_wait_seconds", "gauge",
      "time the last step waited on communication, most of any reporting rank", AGG(r.comm_s) },
    { "loss", "gauge", "loss of the last step, mean over the reporting ranks", AGG(r.loss) },
};

static void put_agg_family(prom_buf_t *b, const char *scope, const fam_t *f, const agg_t *aggs,
                           int n, const char *const *const *labels)
{
    char name[128];
    snprintf(name, sizeof(name), "bmt_%s%s", scope, f->name);
    prom_family(b, name, f->type, f->help);
    for (int i = 0; i < n; i++)
        prom_sample(b, name, labels[i], *(const double *)((const char *)&aggs[i] + f->off));
}

static const char *failure_host(const collector_t *c, int rank)
{
    return c->r[rank].host[0] ? c->r[rank].host : c->host;
}

/* What bmt_rank_exit_code / exit_signal and failed_ranks say of failure f:
 * whether it is an exit code, and the code or signal. */
static bool failure_code(const struct failure *f, int *v)
{
    int st = f->wait_status;
    if (f->aborted)
        return *v = f->abort_status, true;
    if (WIFEXITED(st))
        return *v = WEXITSTATUS(st), true;
    *v = WIFSIGNALED(st) ? WTERMSIG(st) : -1;
    return false;
}

/* bmt_val_loss and bmt_scalar{name}, with the steps they were measured at
 * (lock held). */
static void put_scalars(prom_buf_t *b, const collector_t *c, const char *const *jl)
{
    int v = scalar_find(c, "val_loss");
    if (v >= 0) {
        int64_t step;
        double mean = scalar_mean(c, v, &step);
        prom_family(b, "bmt_val_loss", "gauge",
                    "validation loss (bmt_report_scalar \"val_loss\"): mean of the ranks' last "
                    "values, NaN when one is not finite");
        prom_sample(b, "bmt_val_loss", jl, mean);
        prom_family(b, "bmt_val_loss_step", "gauge", "the step bmt_val_loss was measured at");
        prom_sample(b, "bmt_val_loss_step", jl, (double)step);
    }
    if (c->nsc - (v >= 0) == 0)
        return;
    for (int pass = 0; pass < 2; pass++) {
        const char *name = pass ? "bmt_scalar_step" : "bmt_scalar";
        prom_family(b, name, "gauge",
                    pass ? "the step bmt_scalar was reported at (highest of the ranks)"
                         : "a program's own figure (bmt_report_scalar): mean of the ranks' last "
                           "values, NaN when one is not finite");
        for (int i = 0; i < c->nsc; i++) {
            if (i == v)
                continue;
            int64_t step;
            double mean = scalar_mean(c, i, &step);
            const char *sl[] = { jl[0], jl[1], "name", c->sc[i].name, NULL };
            prom_sample(b, name, sl, pass ? (double)step : mean);
        }
    }
}

/* scrape: a request to /metrics (counted for the linger, in the same critical
 * section as the rendering, so "scraped after the end" means it saw the end). */
static char *metrics_text(collector_t *c, size_t *len, bool scrape)
{
    prom_buf_t b = { 0 };
    pthread_mutex_lock(&c->mu);
    double now = metrics_mono_s(), stale = stale_after(c);
    if (scrape) {
        c->scrape_t[c->scrapes++ % SCRAPES] = now;
        c->scraped_after_end = c->scraped_after_end || c->ended;
    }
    const int G = c->l.groups, P = c->l.gpus_per_group;
    agg_t job;
    aggregate(c, 0, c->l.world, stale, now, &job);
    agg_t *groups = calloc((size_t)G, sizeof(agg_t));
    char(*gname)[16] = calloc((size_t)G, 16);
    const char *(*glab)[5] = calloc((size_t)G, sizeof(*glab));
    const char *const **gl = calloc((size_t)G, sizeof(*gl));
    if (groups == NULL || gname == NULL || glab == NULL || gl == NULL) {
        pthread_mutex_unlock(&c->mu);
        free(groups), free(gname), free(glab), free(gl);
        return NULL;
    }
    for (int g = 0; g < G; g++) {
        aggregate(c, g * P, P, stale, now, &groups[g]);
        snprintf(gname[g], 16, "%d", g);
        glab[g][0] = JOB_LABEL, glab[g][1] = c->job_id, glab[g][2] = "group", glab[g][3] = gname[g];
        glab[g][4] = NULL;
        gl[g] = glab[g];
    }
    const char *jl[] = { JOB_LABEL, c->job_id, NULL };
    const char *const *jls[] = { jl };

    char world[16], groups_s[16], gpg[16], gpn[16], nodes[16];
    snprintf(world, sizeof(world), "%d", c->l.world);
    snprintf(groups_s, sizeof(groups_s), "%d", G);
    snprintf(gpg, sizeof(gpg), "%d", P);
    snprintf(gpn, sizeof(gpn), "%d", c->l.gpus_per_node);
    snprintf(nodes, sizeof(nodes), "%d", c->l.nodes);
    const char *info[] = { JOB_LABEL, c->job_id,       "groups", groups_s,  "gpus_per_group",
                           gpg,       "gpus_per_node", gpn,      "nodes",   nodes,
                           "world",   world,           "device", c->device, NULL };
    prom_family(&b, "bmt_job_info", "gauge", "the job's layout (value 1)");
    prom_sample(&b, "bmt_job_info", info, 1);
    prom_family(&b, "bmt_job_running", "gauge", "1 while the job's ranks run, 0 after");
    prom_sample(&b, "bmt_job_running", jl, c->ended ? 0 : 1);
    prom_family(&b, "bmt_job_state", "gauge",
                "1 for the job's state: running, succeeded (bmlaunch exited 0) or failed");
    static const char *states[] = { "running", "succeeded", "failed" };
    int state = !c->ended ? 0 : c->exit_status == 0 ? 1 : 2;
    for (int i = 0; i < 3; i++) {
        const char *sl[] = { JOB_LABEL, c->job_id, "state", states[i], NULL };
        prom_sample(&b, "bmt_job_state", sl, i == state);
    }
    if (c->ended) {
        prom_family(&b, "bmt_job_exit_code", "gauge",
                    "bmlaunch's exit status (after the job ended; 128+N: a signal N)");
        prom_sample(&b, "bmt_job_exit_code", jl, c->exit_status);
    }
    prom_family(&b, "bmt_ranks_failed", "gauge",
                "ranks of this run that called PMIx_Abort, exited with a non-zero code or by a "
                "signal (a restart starts a new run: see bmt_ranks_failed_total)");
    prom_sample(&b, "bmt_ranks_failed", jl, c->nfailed);
    prom_family(&b, "bmt_ranks_failed_total", "counter",
                "ranks that failed, over every run of the job (restarts included)");
    prom_sample(&b, "bmt_ranks_failed_total", jl, (double)c->failures_total);
    int shown = c->nfailed < COLLECTOR_FAILED_SHOWN ? c->nfailed : COLLECTOR_FAILED_SHOWN;
    for (int pass = 0; pass < 2; pass++) {
        const char *name = pass ? "bmt_rank_exit_signal" : "bmt_rank_exit_code";
        bool any = false;
        for (int i = 0; i < shown; i++) {
            int v;
            if (failure_code(&c->failed[i], &v) == (pass == 1))
                continue;
            if (!any)
                prom_family(&b, name, "gauge",
                            pass ? "the signal that ended a failed rank (the first 16 failed ranks)"
                                 : "the exit code of a failed rank (the first 16 failed ranks)");
            any = true;
            char rs[16];
            snprintf(rs, sizeof(rs), "%d", c->failed[i].rank);
            const char *fl[] = { JOB_LABEL, c->job_id, "rank",
                                 rs,        "host",    failure_host(c, c->failed[i].rank),
                                 NULL };
            prom_sample(&b, name, fl, v);
        }
    }
    {
        int sr[COLLECTOR_STALE_SHOWN];
        double sa[COLLECTOR_STALE_SHOWN];
        int ns = stale_ranks(c, stale, now, sr, sa, COLLECTOR_STALE_SHOWN);
        prom_family(&b, "bmt_stale_window_seconds", "gauge",
                    "a running rank that pushed no step for this long is stale (scalars and "
                    "events alone do not count; --metrics-stale, else 5 step times, at least "
                    "10 s)");
        prom_sample(&b, "bmt_stale_window_seconds", jl, stale);
        prom_family(&b, "bmt_ranks_stale", "gauge",
                    "running ranks that pushed no step for longer than the stale window");
        prom_sample(&b, "bmt_ranks_stale", jl, ns);
        if (ns > 0)
            prom_family(&b, "bmt_rank_stale_seconds", "gauge",
                        "seconds since a stale rank's last push of a step, with its process "
                        "state as bmlaunch sees it (the first 16 stale ranks)");
        for (int i = 0; i < ns && i < COLLECTOR_STALE_SHOWN; i++) {
            char rs[16], st[64];
            snprintf(rs, sizeof(rs), "%d", sr[i]);
            proc_state(c, sr[i], st, sizeof(st));
            const char *sl[] = { JOB_LABEL, c->job_id, "rank", rs, "host", failure_host(c, sr[i]),
                                 "state",   st,        NULL };
            prom_sample(&b, "bmt_rank_stale_seconds", sl, sa[i]);
        }
    }
    prom_family(&b, "bmt_ranks", "gauge", "ranks of the job");
    prom_sample(&b, "bmt_ranks", jl, c->l.world);
    prom_family(&b, "bmt_ranks_alive", "gauge", "rank processes still running");
    prom_sample(&b, "bmt_ranks_alive", jl, c->alive);
    prom_family(&b, "bmt_ranks_reporting", "gauge",
                "running ranks that pushed a step within the stale window");
    prom_sample(&b, "bmt_ranks_reporting", jl, job.reporting);
    prom_family(&b, "bmt_step", "gauge",
                "last step every rank has reported in this run (0 until every rank reported one)");
    prom_sample(&b, "bmt_step", jl, (double)job.step_min);
    prom_family(&b, "bmt_tokens_total", "counter", "tokens processed by all ranks");
    prom_sample(&b, "bmt_tokens_total", jl, job.tokens);
    prom_family(&b, "bmt_samples_total", "counter", "samples processed by all ranks");
    prom_sample(&b, "bmt_samples_total", jl, job.samples);
    prom_family(&b, "bmt_skipped_steps_total", "counter",
                "optimizer steps skipped for inf/nan gradients");
    prom_sample(&b, "bmt_skipped_steps_total", jl, (double)job.skipped);
    prom_family(&b, "bmt_model_parameters", "gauge", "parameters of the model");
    prom_sample(&b, "bmt_model_parameters", jl, (double)job.params);
    prom_family(&b, "bmt_grad_norm", "gauge", "global gradient norm of the last step");
    prom_sample(&b, "bmt_grad_norm", jl, job.grad_norm);
    prom_family(&b, "bmt_learning_rate", "gauge", "learning rate of the last step");
    prom_sample(&b, "bmt_learning_rate", jl, job.lr);
    for (size_t i = 0; i < sizeof(job_fams) / sizeof(job_fams[0]); i++)
        put_agg_family(&b, "", &job_fams[i], &job, 1, jls);
    prom_family(&b, "bmt_steps_total", "counter",
                "steps the collector has seen (each once; a resumed run repeats steps)");
    prom_sample(&b, "bmt_steps_total", jl, (double)c->steps_total);
    prom_family(&b, "bmt_step_duration_seconds_total", "counter",
                "sum over the steps of the slowest rank's step time (rate() over a window: the "
                "mean step time, nothing between scrapes lost)");
    prom_sample(&b, "bmt_step_duration_seconds_total", jl, c->step_seconds_total);
    prom_family(&b, "bmt_comm_wait_seconds_total", "counter",
                "sum over the steps of the longest communication wait of any rank");
    prom_sample(&b, "bmt_comm_wait_seconds_total", jl, c->comm_seconds_total);
    put_scalars(&b, c, jl);
    /* Absent while no rank measures memory (a Python job): not a 0. */
    for (int pass = 0; pass < 2 && job.mem_n > 0; pass++) {
        const char *name = pass ? "bmt_memory_peak_bytes" : "bmt_memory_bytes";
        prom_family(&b, name, "gauge",
                    pass ? "device memory peak during the last step by kind, most of any rank "
                           "(bytes)"
                         : "device memory now by kind, most of any rank (bytes)");
        for (int k = 0; k < BMT_MEM_KIND_COUNT; k++) {
            const char *ml[] = { JOB_LABEL, c->job_id, "kind", c->kinds[k], NULL };
            prom_sample(&b, name, ml, (double)(pass ? job.mem_peak[k] : job.mem[k]));
        }
    }
    prom_family(&b, "bmt_events_total", "counter",
                "events: the ranks' (checkpoint_saved, restart, abort, note) and bmlaunch's "
                "(rank_failed: the first 16 failed ranks of a run)");
    for (int k = 1; k < EV_KINDS; k++) {
        const char *el[] = { JOB_LABEL, c->job_id, "kind", ev_names[k], NULL };
        prom_sample(&b, "bmt_events_total", el, (double)c->ev_count[k]);
    }
    prom_family(&b, "bmt_collector_pushes_total", "counter",
                "pushes received by the collector, by HTTP status");
    for (int i = 0; i < c->ncodes; i++) {
        char code[8];
        snprintf(code, sizeof(code), "%d", c->codes[i]);
        const char *pl[] = { JOB_LABEL, c->job_id, "code", code, NULL };
        prom_sample(&b, "bmt_collector_pushes_total", pl, (double)c->pushes[i]);
    }

    /* After the answers: a refused push's items count here too. */
    prom_family(&b, "bmt_push_dropped_total", "counter",
                "metrics items the ranks' push plugins dropped (collector unreachable or slow), "
                "and the items of pushes the collector refused");
    prom_sample(&b, "bmt_push_dropped_total", jl, (double)job.dropped);
    prom_family(&b, "bmt_push_old_run_items_total", "counter",
                "items of pushes refused (409) because they came from an earlier run of the job "
                "or from a process of a rank that a newer one replaced (late pushes; also in "
                "bmt_push_dropped_total)");
    prom_sample(&b, "bmt_push_old_run_items_total", jl, (double)c->old_run_items);
    /* per group */
    for (size_t i = 0; i < sizeof(job_fams) / sizeof(job_fams[0]); i++)
        put_agg_family(&b, "group_", &job_fams[i], groups, G, gl);
    prom_family(&b, "bmt_group_step", "gauge", "last step every rank of the group has reported");
    for (int g = 0; g < G; g++)
        prom_sample(&b, "bmt_group_step", gl[g], (double)groups[g].step_min);
    prom_family(&b, "bmt_group_ranks_reporting", "gauge",
                "ranks of the group that pushed recently");
    for (int g = 0; g < G; g++)
        prom_sample(&b, "bmt_group_ranks_reporting", gl[g], groups[g].reporting);
    if (job.mem_n > 0)
        prom_family(&b, "bmt_group_memory_bytes", "gauge",
                    "device memory now, all kinds, most of any rank of the group (bytes; NaN: "
                    "not measured)");
    for (int g = 0; g < G && job.mem_n > 0; g++)
        prom_sample(&b, "bmt_group_memory_bytes", gl[g],
                    groups[g].mem_n ? (double)groups[g].mem_total : NAN);

    /* per rank, on request */
    if (c->per_rank) {
        static const struct {
            const char *name, *help;
            size_t off;
        } rf[] = {
            { "bmt_rank_tokens_per_second", "tokens per second of the rank's last step",
              offsetof(bmt_step_metrics_t, tokens_per_s) },
            { "bmt_rank_step_duration_seconds", "wall time of the rank's last step",
              offsetof(bmt_step_metrics_t, step_time_s) },
            { "bmt_rank_comm_wait_seconds", "time the rank's last step waited on communication",
              offsetof(bmt_step_metrics_t, comm_wait_s) },
            { "bmt_rank_mfu_ratio", "model FLOP utilization of the rank's last step",
              offsetof(bmt_step_metrics_t, mfu) },
            { "bmt_rank_loss", "the rank's last loss", offsetof(bmt_step_metrics_t, loss) },
        };
        for (size_t f = 0; f < sizeof(rf) / sizeof(rf[0]); f++) {
            prom_family(&b, rf[f].name, "gauge", rf[f].help);
            for (int r = 0; r < c->l.world; r++) {
                if (!c->r[r].seen)
                    continue;
                char rs[16];
                snprintf(rs, sizeof(rs), "%d", r);
                const char *rl[] = {
                    JOB_LABEL, c->job_id, "group", gname[r / P], "rank", rs, NULL
                };
                prom_sample(&b, rf[f].name, rl,
                            *(const double *)((const char *)&c->r[r].m + rf[f].off));
            }
        }
        for (int f = 0; f < 2; f++) {
            const char *name = f ? "bmt_rank_last_push_age_seconds" : "bmt_rank_step";
            prom_family(&b, name, "gauge",
                        f ? "seconds since the rank last pushed" : "the rank's last step");
            for (int r = 0; r < c->l.world; r++) {
                if (!c->r[r].seen)
                    continue;
                char rs[16];
                snprintf(rs, sizeof(rs), "%d", r);
                const char *rl[] = {
                    JOB_LABEL, c->job_id, "group", gname[r / P], "rank", rs, NULL
                };
                prom_sample(&b, name, rl, f ? now - c->r[r].last_push : (double)c->r[r].m.step);
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(groups);
    free(gname);
    free(glab);
    free(gl);
    if (b.oom) {
        prom_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.data;
}

char *collector_metrics_text(collector_t *c, size_t *len) { return metrics_text(c, len, false); }

double collector_linger_auto(collector_t *c)
{
    pthread_mutex_lock(&c->mu);
    double gap = 0;
    uint64_t n = c->scrapes < SCRAPES ? c->scrapes : SCRAPES;
    for (uint64_t i = c->scrapes - n + 1; i < c->scrapes; i++) {
        double d = c->scrape_t[i % SCRAPES] - c->scrape_t[(i - 1) % SCRAPES];
        gap = d > gap ? d : gap;
    }
    pthread_mutex_unlock(&c->mu);
    if (n < 2)
        return 0;
    double s = 1.5 * gap + 1;
    return s < COLLECTOR_LINGER_MAX_S ? s : COLLECTOR_LINGER_MAX_S;
}

bool collector_scraped_after_end(collector_t *c)
{
    pthread_mutex_lock(&c->mu);
    bool r = c->scraped_after_end;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* ------------------------------------------------------------ /api/status */

static json_t *agg_json(const agg_t *a)
{
    return json_pack("{sIsIsisisosososososososo}", "step", (json_int_t)a->step_min, "step_max",
                     (json_int_t)a->step_max, "ranks_seen", a->seen, "ranks_reporting",
                     a->reporting, "tokens_per_second", metrics_real(a->r.tps),
                     "samples_per_second", metrics_real(a->r.sps), "flops_per_second",
                     metrics_real(a->r.fps), "mfu", metrics_real(a->r.mfu), "loss",
                     metrics_real(a->r.loss), "step_time_seconds", metrics_real(a->r.step_s),
                     "comm_wait_seconds", metrics_real(a->r.comm_s), "memory_bytes",
                     a->mem_n ? json_integer((json_int_t)a->mem_total) : json_null());
}

char *collector_status_json(collector_t *c, bool ranks, size_t *len)
{
    pthread_mutex_lock(&c->mu);
    double now = metrics_mono_s(), stale = stale_after(c);
    agg_t job;
    aggregate(c, 0, c->l.world, stale, now, &job);
    json_t *doc = json_object();
    json_t *jj = agg_json(&job);
    if (doc && jj) {
        json_object_update(doc, jj);
        json_object_set_new(doc, "job", json_string(c->job_id));
        json_object_set_new(doc, "state", json_string(c->ended ? "ended" : "running"));
        if (c->ended)
            json_object_set_new(doc, "exit_status", json_integer(c->exit_status));
        json_object_set_new(doc, "ranks_failed", json_integer(c->nfailed));
        json_object_set_new(doc, "ranks_failed_total", json_integer((json_int_t)c->failures_total));
        json_t *fl = json_array();
        for (int i = 0; fl && i < c->nfailed && i < COLLECTOR_FAILED_SHOWN; i++) {
            int v, rk = c->failed[i].rank;
            bool code = failure_code(&c->failed[i], &v);
            json_t *x = json_pack("{sissso}", "rank", rk, "host", failure_host(c, rk),
                                  code ? "exit_code" : "signal", json_integer(v));
            if (x && c->failed[i].aborted)
                json_object_set_new(x, "aborted", json_true());
            if (x)
                json_array_append_new(fl, x);
        }
        json_object_set_new(doc, "failed_ranks", fl);
        int sr[COLLECTOR_STALE_SHOWN];
        double sa[COLLECTOR_STALE_SHOWN];
        int ns = stale_ranks(c, stale, now, sr, sa, COLLECTOR_STALE_SHOWN);
        json_object_set_new(doc, "per_rank", json_boolean(c->per_rank));
        json_object_set_new(doc, "steps_total", json_integer((json_int_t)c->steps_total));
        json_object_set_new(doc, "stale_window_seconds", json_real(stale));
        json_object_set_new(doc, "ranks_stale", json_integer(ns));
        json_t *sl = json_array();
        for (int i = 0; sl && i < ns && i < COLLECTOR_STALE_SHOWN; i++) {
            char st[64];
            proc_state(c, sr[i], st, sizeof(st));
            json_t *x = json_pack("{sissssso}", "rank", sr[i], "host", failure_host(c, sr[i]),
                                  "state", st, "seconds", json_real(sa[i]));
            if (x)
                json_array_append_new(sl, x);
        }
        json_object_set_new(doc, "stale_ranks", sl);
        json_object_set_new(doc, "started", json_real(c->started));
        json_object_set_new(doc, "now", json_real(metrics_unix_s()));
        json_object_set_new(doc, "layout",
                            json_pack("{sisisisisiss}", "groups", c->l.groups, "gpus_per_group",
                                      c->l.gpus_per_group, "gpus_per_node", c->l.gpus_per_node,
                                      "nodes", c->l.nodes, "world", c->l.world, "device",
                                      c->device));
        json_object_set_new(doc, "ranks_alive", json_integer(c->alive));
        json_object_set_new(doc, "tokens_total", json_real(job.tokens));
        json_object_set_new(doc, "samples_total", json_real(job.samples));
        json_object_set_new(doc, "params", json_integer((json_int_t)job.params));
        json_object_set_new(doc, "grad_norm", metrics_real(job.grad_norm));
        json_object_set_new(doc, "learning_rate", metrics_real(job.lr));
        json_object_set_new(doc, "skipped_steps", json_integer((json_int_t)job.skipped));
        json_object_set_new(doc, "dropped", json_integer((json_int_t)job.dropped));
        json_object_set_new(doc, "old_run_items", json_integer((json_int_t)c->old_run_items));
        json_object_set_new(doc, "restart", json_integer((json_int_t)c->restart));
        json_t *groups = json_array();
        for (int g = 0; groups && g < c->l.groups; g++) {
            agg_t a;
            aggregate(c, g * c->l.gpus_per_group, c->l.gpus_per_group, stale, now, &a);
            json_t *x = agg_json(&a);
            if (x) {
                json_object_set_new(x, "group", json_integer(g));
                json_array_append_new(groups, x);
            }
        }
        json_object_set_new(doc, "groups", groups);
        json_t *hist = json_array();
        for (int i = 0; hist && i < c->nhist; i++) {
            const struct point *p = &c->hist[i];
            json_array_append_new(
                hist,
                json_pack("{sIsisososososososo}", "step", (json_int_t)p->step, "ranks", p->ranks,
                          "time", metrics_real(p->time), "tokens_per_second", metrics_real(p->tps),
                          "flops_per_second", metrics_real(p->fps), "loss", metrics_real(p->loss),
                          "mfu", metrics_real(p->mfu), "step_time_seconds", metrics_real(p->step_s),
                          "comm_wait_seconds", metrics_real(p->comm_s)));
        }
        json_object_set_new(doc, "history", hist);
        json_t *vh = json_array(), *scs = json_object();
        for (int i = 0; vh && i < c->nvhist; i++)
            json_array_append_new(vh, json_pack("{sIso}", "step", (json_int_t)c->vhist[i].step,
                                                "val_loss",
                                                metrics_real(c->vhist[i].sum / c->vhist[i].n)));
        json_object_set_new(doc, "val_history", vh);
        for (int i = 0; scs && i < c->nsc; i++) {
            int64_t step;
            double mean = scalar_mean(c, i, &step);
            json_object_set_new(
                scs, c->sc[i].name,
                json_pack("{sosI}", "value", metrics_real(mean), "step", (json_int_t)step));
        }
        json_object_set_new(doc, "scalars", scs);
        json_t *evs = json_array();
        for (int i = 0; evs && i < c->nev; i++) {
            const struct event *e = &c->ev[(c->evnext - c->nev + i + EVENTS) % EVENTS];
            json_t *x = metrics_event_json(&e->e);
            if (x == NULL) { /* cannot be (details are UTF-8 by now): say so, never skip it */
                metrics_event_t t = e->e;
                snprintf(t.detail, sizeof(t.detail), "(this event's detail could not be shown)");
                x = metrics_event_json(&t);
            }
            if (x) {
                json_object_set_new(x, "rank", json_integer(e->rank));
                json_array_append_new(evs, x);
            }
        }
        json_object_set_new(doc, "events", evs);
        if (ranks) {
            json_t *rs = json_array();
            for (int r = 0; rs && r < c->l.world; r++) {
                const struct rank_state *s = &c->r[r];
                json_t *x = s->seen ? metrics_step_json(&s->m, c->kinds, BMT_MEM_KIND_COUNT)
                                    : json_object();
                if (x == NULL)
                    continue;
                json_object_set_new(x, "rank", json_integer(r));
                json_object_set_new(x, "group", json_integer(r / c->l.gpus_per_group));
                json_object_set_new(x, "host", json_string(s->host));
                json_object_set_new(x, "seen", json_boolean(s->seen));
                json_object_set_new(x, "exited", json_boolean(s->exited));
                json_object_set_new(
                    x, "dropped",
                    json_integer((json_int_t)count_add(s->drop_base, rank_dropped_run(s))));
                json_object_set_new(x, "run", s->has_run ? metrics_run_json(&s->run) : json_null());
                json_object_set_new(x, "last_push_age_seconds",
                                    s->seen ? json_real(now - s->last_push) : json_null());
                json_array_append_new(rs, x);
            }
            json_object_set_new(doc, "ranks", rs);
        }
    }
    pthread_mutex_unlock(&c->mu);
    json_decref(jj);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (text)
        *len = strlen(text);
    return text;
}

/* ------------------------------------------------------------ HTTP */

enum route {
    R_NONE,
    R_PAGE,
    R_METRICS,
    R_STATUS,
    R_PUSH
};

/* One request, from the moment its request line is read (uri_seen): so that
 * an answer libmicrohttpd gives by itself before our handler runs (400 for a
 * malformed Content-Length, 413/431 for headers too large, 505, ...) is
 * still counted when the request was a push (completed). */
struct req {
    bool push;     /* to /api/push */
    bool started;  /* handle has seen its headers */
    bool answered; /* handle queued an answer (counted there) */
    char *body;
    size_t len;
    bool too_big;
};

static void *uri_seen(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)cls, (void)conn;
    struct req *rq = calloc(1, sizeof(*rq));
    if (rq)
        rq->push = strncmp(uri, "/api/push", 9) == 0 && (uri[9] == '\0' || uri[9] == '?');
    return rq; /* NULL (no memory): handle makes one */
}

/* csp: the Content-Security-Policy (the page's), or NULL. */
static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, const char *ctype,
                               const char *body, size_t len, enum MHD_ResponseMemoryMode mode,
                               const char *allow, const char *csp)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, mode);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (allow)
        MHD_add_response_header(r, "Allow", allow);
    if (csp)
        MHD_add_response_header(r, "Content-Security-Policy", csp);
    if (code == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"bmt\"");
    enum MHD_Result ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned code, const char *msg)
{
    char buf[600];
    int n = snprintf(buf, sizeof(buf), "%s\n", msg);
    return respond(conn, code, "text/plain; charset=utf-8", buf,
                   (size_t)(n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1), MHD_RESPMEM_MUST_COPY,
                   NULL, NULL);
}

/* /api/status takes one query argument, ranks=0 or ranks=1. Anything else
 * (?ranks=true, a misspelt ?rank=1) would be answered without what it asked
 * for, and nothing would say so: it is refused (400) with the reason. */
struct status_args {
    bool ranks;
    char why[200]; /* empty while every argument is good */
};

static enum MHD_Result status_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    struct status_args *a = cls;
    (void)kind;
    if (key[0] == '\0' && value == NULL) /* "?&" or a trailing '&': no argument */
        return MHD_YES;
    bool is_ranks = strcmp(key, "ranks") == 0;
    if (is_ranks && value && (strcmp(value, "0") == 0 || strcmp(value, "1") == 0)) {
        a->ranks = value[0] == '1';
        return MHD_YES;
    }
    char k[48], v[48]; /* shown, as printable ASCII */
    const char *src[2] = { key, value ? value : "" };
    char *dst[2] = { k, v };
    for (int j = 0; j < 2; j++) {
        size_t i = 0;
        for (; src[j][i] && i < sizeof(k) - 1; i++)
            dst[j][i] = src[j][i] > 0x20 && src[j][i] < 0x7f ? src[j][i] : '?';
        dst[j][i] = '\0';
    }
    if (is_ranks)
        snprintf(a->why, sizeof(a->why),
                 "/api/status?ranks=%s: ranks must be 1 (add each rank's figures) or 0", v);
    else
        snprintf(a->why, sizeof(a->why),
                 "/api/status takes no query argument '%s': its only one is ranks=1 (add each "
                 "rank's figures) or ranks=0",
                 k);
    return MHD_NO;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    collector_t *c = cls;
    enum route route = strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0 ? R_PAGE
                       : strcmp(url, "/metrics") == 0                           ? R_METRICS
                       : strcmp(url, "/api/status") == 0                        ? R_STATUS
                       : strcmp(url, "/api/push") == 0                          ? R_PUSH
                                                                                : R_NONE;
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    struct req *rq = *con_cls;
    if (rq == NULL && (rq = *con_cls = calloc(1, sizeof(*rq))) == NULL)
        return MHD_NO;
    if (!rq->started) { /* headers only, so far */
        rq->started = true;
        rq->answered = true; /* unless it reads the body, below */
        if (route == R_NONE)
            return respond_text(conn, 404, "not found: try /, /metrics or /api/status");
        if (route == R_PUSH && strcmp(method, "POST") != 0) {
            collector_count(c, 405);
            return respond(conn, 405, "text/plain; charset=utf-8", "use POST\n", 9,
                           MHD_RESPMEM_PERSISTENT, "POST", NULL);
        }
        if (route != R_PUSH && !get)
            return respond(conn, 405, "text/plain; charset=utf-8", "use GET\n", 8,
                           MHD_RESPMEM_PERSISTENT, "GET, HEAD", NULL);
        if (route == R_PAGE)
            return respond(conn, 200, "text/html; charset=utf-8", collector_page,
                           (size_t)(collector_page_end - collector_page) - 1,
                           MHD_RESPMEM_PERSISTENT, NULL, c->csp);
        if (route == R_METRICS || route == R_STATUS) {
            size_t len = 0;
            struct status_args args = { 0 };
            if (route == R_STATUS) {
                MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, status_arg, &args);
                if (args.why[0])
                    return respond_text(conn, 400, args.why);
            }
            char *text = route == R_METRICS ? metrics_text(c, &len, true)
                                            : collector_status_json(c, args.ranks, &len);
            if (text == NULL)
                return respond_text(conn, 500, "out of memory");
            return respond(conn, 200, route == R_METRICS ? PROM_CONTENT_TYPE : "application/json",
                           text, len, MHD_RESPMEM_MUST_FREE, NULL, NULL);
        }
        /* A push: refuse what we can before reading the body. */
        const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
        if (!token_ok(c, auth)) {
            collector_count(c, 401);
            return respond_text(conn, 401, "missing or wrong bearer token");
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > COLLECTOR_MAX_BODY) {
            collector_count(c, 413);
            return respond_text(conn, 413, "push body larger than 4 MiB");
        }
        rq->answered = false;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!rq->too_big && rq->len + *upload_size <= COLLECTOR_MAX_BODY) {
            char *b = realloc(rq->body, rq->len + *upload_size + 1);
            if (b == NULL)
                rq->too_big = true;
            else {
                memcpy(b + rq->len, upload, *upload_size);
                rq->body = b;
                rq->len += *upload_size;
            }
        } else
            rq->too_big = true;
        *upload_size = 0;
        return MHD_YES;
    }
    char why[400];
    rq->answered = true;
    if (rq->too_big) {
        collector_count(c, 413);
        return respond_text(conn, 413, "push body larger than 4 MiB");
    }
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    int code = collector_ingest(c, auth, rq->body ? rq->body : "", rq->len, why, sizeof(why));
    if (code == 200)
        return respond(conn, 200, "application/json", "{\"ok\":true}\n", 12, MHD_RESPMEM_PERSISTENT,
                       NULL, NULL);
    return respond_text(conn, (unsigned)code, why);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    struct req *rq = *con_cls;
    if (rq && rq->push && !rq->answered) {
        /* libmicrohttpd answered a push by itself, or nobody did (the client
         * went away): count what it answered, if anything. */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
        if (ci && ci->http_status >= 100)
            collector_count(cls, (int)ci->http_status);
    }
    if (rq) {
        free(rq->body);
        free(rq);
        *con_cls = NULL;
    }
}

void collector_conn_limits(int world, long nofile, unsigned *total, unsigned *per_ip)
{
    /* bmlaunch's own descriptors: a few per rank (pipes, pidfds, logs) and
     * PMIx's; a connection past the fd limit would wait in the backlog for an
     * idle one's timeout, so the limit must come first. */
    long reserve = 5L * world + 128, t = nofile - reserve;
    t = t < 64 ? 64 : t > 16384 ? 16384 : t;
    long p = t / 2 > 2L * world + 64 ? t / 2 : 2L * world + 64;
    *total = (unsigned)t;
    *per_ip = (unsigned)(p < t ? p : t);
}

static struct MHD_Daemon *start(collector_t *c, const struct sockaddr *sa, bool v6)
{
    /* epoll and a pool of two threads: thousands of idle connections cost
     * nothing per request; the limits close the surplus at once instead of
     * leaving it (and everyone behind it) in the listen backlog. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL;
    if (v6)
        flags |= MHD_USE_IPv6;
    /* HTTPS: MHD hands the PEM texts to GnuTLS when it starts. */
    struct MHD_OptionItem tls[] = {
        { MHD_OPTION_HTTPS_MEM_KEY, 0, c->tls_key },
        { MHD_OPTION_HTTPS_MEM_CERT, 0, c->tls_cert },
        { MHD_OPTION_END, 0, NULL },
    };
    if (c->tls_cert)
        flags |= MHD_USE_TLS;
    else
        tls[0].option = MHD_OPTION_END;
    struct rlimit rl = { 0, 0 };
    getrlimit(RLIMIT_NOFILE, &rl);
    long nofile =
        rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1L << 20 ? 1L << 20 : (long)rl.rlim_cur;
    unsigned total, per_ip;
    collector_conn_limits(c->l.world, nofile, &total, &per_ip);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, handle, c, MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_NOTIFY_COMPLETED,
        completed, c, MHD_OPTION_URI_LOG_CALLBACK, uri_seen, c, MHD_OPTION_THREAD_POOL_SIZE, 2u,
        MHD_OPTION_CONNECTION_TIMEOUT, COLLECTOR_IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT, total,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (d && c->verbose)
        fprintf(stderr,
                "bmlaunch: metrics: at most %u connections, %u from one address, idle ones "
                "closed after %u s (open files limit %ld)\n",
                total, per_ip, COLLECTOR_IDLE_TIMEOUT_S, nofile);
    return d;
}

/* More connections than the soft RLIMIT_NOFILE allows wait in the backlog:
 * take what the hard limit allows (the ranks inherit it). */
static void raise_nofile_to_hard(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int collector_listen(collector_t *c, const char *bind, int port, bool fallback, bmt_error_t *err)
{
    struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_PASSIVE, .ai_socktype = SOCK_STREAM },
                    *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo(bind, ps, &hints, &ai) != 0 || ai == NULL)
        return errprintf(err,
                         "--metrics-bind '%.200s' is not a numeric IPv4 or IPv6 address (e.g. "
                         "127.0.0.1, 0.0.0.0, ::1)",
                         bind);
    bool v6 = ai->ai_family == AF_INET6;
    if (c->tls_cert && !collector_tls_supported()) {
        freeaddrinfo(ai);
        return errprintf(err,
                         "this libmicrohttpd (%s) was built without TLS: it cannot serve "
                         "HTTPS (--metrics-tls off serves plain HTTP)",
                         MHD_get_version());
    }
    raise_nofile_to_hard();
    c->d = start(c, ai->ai_addr, v6);
    if (c->d == NULL && fallback && port != 0) {
        if (v6)
            ((struct sockaddr_in6 *)ai->ai_addr)->sin6_port = 0;
        else
            ((struct sockaddr_in *)ai->ai_addr)->sin_port = 0;
        c->d = start(c, ai->ai_addr, v6);
        if (c->d)
            fprintf(stderr, "bmlaunch: metrics port %d is taken; using a free one instead\n", port);
    }
    freeaddrinfo(ai);
    if (c->d == NULL)
        return errprintf(err,
                         "cannot serve metrics on %.200s port %d (in use, or not an address of "
                         "this host%s): choose --metrics-port N, or 0 to turn the endpoint off",
                         bind, port, c->tls_cert ? ", or the TLS certificate refused" : "");
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(c->d, MHD_DAEMON_INFO_BIND_PORT);
    c->port = info ? info->port : port;
    return 0;
}

void collector_destroy(collector_t *c)
{
    if (c == NULL)
        return;
    if (c->d)
        MHD_stop_daemon(c->d);
    pthread_mutex_destroy(&c->mu);
    for (int i = 0; i < c->nsc; i++)
        free(c->sc[i].v), free(c->sc[i].step), free(c->sc[i].serial);
    free(c->vgiven);
    free(c->vnext);
    if (c->tls_key)
        explicit_bzero(c->tls_key, strlen(c->tls_key));
    free(c->tls_key);
    free(c->tls_cert);
    free(c->r);
    free(c);
}
