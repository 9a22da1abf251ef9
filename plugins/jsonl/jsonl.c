/* plugins/jsonl/jsonl.c — one JSON line per step (and per event and scalar) per rank, to a file.
 *
 * The file is BMT_JSONL with %r replaced by the rank, %j by the job id and %%
 * by '%' (default bmt-metrics-%j-%r.jsonl: one file per rank). It is opened for
 * appending in init, so a path that cannot be written fails at bmt_init. Each
 * line is written with one write(2) on an O_APPEND descriptor: ranks that share
 * one file (a pattern without %r) interleave whole lines on a local file
 * system. Lines are
 *   {"type": "step", "job": ..., "rank": r, <the metrics of metrics_json.h>}
 *   {"type": "event", "job": ..., "rank": r, "kind": ..., "step": ..., ...}
 *   {"type": "scalar", "job": ..., "rank": r, "name": ..., "value": ..., "step": ..., ...}
 * Writing happens on the plugin's thread (a slow disk never stalls a step);
 * finalize writes what is queued, within the flush time, and fsyncs.
 *
 * A line that cannot be written whole (disk full, file size limit, I/O error)
 * ends the writing: the cut part is taken back off the file when no other rank
 * wrote after it (so that every line of the file stays JSON), nothing more is
 * written (a second write past RLIMIT_FSIZE would kill the rank with SIGXFSZ),
 * the lines lost are counted and said at finalize, and job->fail makes the
 * rank's next bmt_report_* fail (unless BMT_PLUGIN_ERRORS=warn).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bmt/plugin.h"
#include "../common/metrics_json.h"
#include "../common/queue.h"

#define BATCH 64

struct jsonl {
    pq_t *q;
    pthread_t thread;
    int fd;
    int rank;
    char job[256];
    char path[4096];
    const char *kind_names[BMT_METRICS_MEM_KINDS];
    char kind_store[BMT_METRICS_MEM_KINDS][32];
    int kinds;
    double flush_s;
    const bmt_job_info_t *info; /* for info->fail (valid until finalize returns) */
    bool write_failed;          /* a line could not be written: no more are */
    char fail_why[160];         /* its cause */
    uint64_t lost;              /* lines not written since (that one included) */
    metrics_item_t batch[BATCH];
};

/* Expand %r, %j and %% of pattern into out. Returns 0, or -1 with why. */
static int expand(const char *pattern, int rank, const char *job, char *out, size_t len, char *why,
                  size_t wlen)
{
    size_t k = 0;
    for (const char *s = pattern; *s; s++) {
        char piece[300];
        if (*s != '%') {
            piece[0] = *s;
            piece[1] = '\0';
        } else if (s[1] == 'r') {
            snprintf(piece, sizeof(piece), "%d", rank);
            s++;
        } else if (s[1] == 'j') {
            snprintf(piece, sizeof(piece), "%s", job);
            s++;
        } else if (s[1] == '%') {
            snprintf(piece, sizeof(piece), "%%");
            s++;
        } else {
            snprintf(why, wlen, "BMT_JSONL='%.200s': unknown %%%c (use %%r, %%j or %%%%)", pattern,
                     s[1] ? s[1] : ' ');
            return -1;
        }
        size_t n = strlen(piece);
        if (k + n + 1 > len) {
            snprintf(why, wlen, "BMT_JSONL='%.200s' is too long", pattern);
            return -1;
        }
        memcpy(out + k, piece, n);
        k += n;
    }
    out[k] = '\0';
    if (k == 0) {
        snprintf(why, wlen, "BMT_JSONL is empty");
        return -1;
    }
    return 0;
}

/* The first line that cannot be written: say it, stop, and tell libbmt. */
static void stop_writing(struct jsonl *j, const char *why)
{
    j->write_failed = true;
    snprintf(j->fail_why, sizeof(j->fail_why), "%s", why);
    fprintf(stderr, "bmt: rank %d: jsonl: writing %s failed: %s\n", j->rank, j->path, why);
    if (j->info->size > offsetof(bmt_job_info_t, fail) && j->info->fail) {
        char msg[4400];
        snprintf(msg, sizeof(msg), "jsonl: writing %s failed: %s", j->path, why);
        j->info->fail(j->info, msg);
    }
}

/* Take the cut line of a short write back off the file, when it is still
 * the file's end (another rank sharing the file may have appended since). */
static void take_back(struct jsonl *j, size_t written)
{
    off_t end = lseek(j->fd, 0, SEEK_CUR); /* O_APPEND: the end of our write */
    struct stat st;
    if (end >= (off_t)written && fstat(j->fd, &st) == 0 && st.st_size == end &&
        ftruncate(j->fd, end - (off_t)written) == 0)
        return;
    fprintf(stderr, "bmt: rank %d: jsonl: %s may end in a cut line (%zu bytes)\n", j->rank, j->path,
            written);
}

static void write_item(struct jsonl *j, const metrics_item_t *it)
{
    if (j->write_failed) {
        j->lost++;
        return;
    }
    static const char *const type[] = { "step", "event", "scalar" }; /* metrics_item_type_t */
    json_t *o = it->type == METRICS_EVENT ? metrics_event_json(&it->u.event)
                : it->type == METRICS_SCALAR
                    ? metrics_scalar_json(&it->u.scalar)
                    : metrics_step_json(&it->u.step, j->kind_names, j->kinds);
    json_t *head = json_pack("{sssssi}", "type", type[it->type], "job", j->job, "rank", j->rank);
    if (o == NULL || head == NULL || json_object_update(head, o) < 0) {
        json_decref(o);
        json_decref(head);
        j->lost++;
        stop_writing(j, "cannot make a line's JSON (out of memory?); further lines are lost");
        return;
    }
    json_decref(o);
    char *line = json_dumps(head, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(head);
    if (line == NULL) {
        j->lost++;
        stop_writing(j, "cannot make a line's JSON (out of memory?); further lines are lost");
        return;
    }
    size_t n = strlen(line);
    line[n] = '\n'; /* one write: replaces the terminator, which json_dumps allocated */
    ssize_t w;
    do
        w = write(j->fd, line, n + 1);
    while (w < 0 && errno == EINTR);
    if (w < 0 || (size_t)w != n + 1) {
        char why[160];
        if (w < 0)
            snprintf(why, sizeof(why), "%s; further lines are lost", strerror(errno));
        else { /* not written again to learn why: past RLIMIT_FSIZE that is SIGXFSZ */
            snprintf(why, sizeof(why),
                     "only %zd of %zu bytes of a line written (disk full, or the file size "
                     "limit: ulimit -f); further lines are lost",
                     w, n + 1);
            take_back(j, (size_t)w);
        }
        j->lost++;
        stop_writing(j, why);
    }
    free(line);
}

static void *run(void *arg)
{
    struct jsonl *j = arg;
    double deadline = 0;
    for (;;) {
        bool closing = pq_closed(j->q);
        if (closing && deadline == 0)
            deadline = metrics_mono_s() + j->flush_s;
        size_t n = pq_pop(j->q, j->batch, BATCH, closing ? 0 : 1.0);
        if (n == 0 && closing)
            break;
        for (size_t i = 0; i < n; i++)
            write_item(j, &j->batch[i]);
        if (closing && metrics_mono_s() > deadline) {
            for (size_t k; (k = pq_pop(j->q, j->batch, BATCH, 0)) > 0;)
                pq_count_dropped(j->q, k);
            break;
        }
    }
    return NULL;
}

static int jsonl_init(const bmt_job_info_t *job, void **state, char *err, size_t len)
{
    struct jsonl *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return snprintf(err, len, "out of memory"), -1;
    j->rank = job->rank;
    j->info = job;
    j->flush_s = job->flush_timeout_s;
    snprintf(j->job, sizeof(j->job), "%s", job->job_id);
    j->kinds = job->mem_kinds < BMT_METRICS_MEM_KINDS ? job->mem_kinds : BMT_METRICS_MEM_KINDS;
    for (int k = 0; k < j->kinds; k++) {
        snprintf(j->kind_store[k], sizeof(j->kind_store[k]), "%s", job->mem_kind_names[k]);
        j->kind_names[k] = j->kind_store[k];
    }
    const char *pattern = job->knob("BMT_JSONL");
    const char *qs = job->knob("BMT_METRICS_QUEUE");
    char *end = NULL;
    /* digits only: strtol alone takes blanks, a sign and hex */
    long cap = qs && qs[0] >= '0' && qs[0] <= '9' ? strtol(qs, &end, 10) : 0;
    if (cap == 0 || *end != '\0' || cap < 1 || cap > 1000000) {
        snprintf(err, len, "BMT_METRICS_QUEUE='%.40s' must be a count from 1 to 1000000",
                 qs ? qs : "");
        free(j);
        return -1;
    }
    if (expand(pattern ? pattern : "", job->rank, job->job_id, j->path, sizeof(j->path), err, len) <
        0) {
        free(j);
        return -1;
    }
    /* O_NONBLOCK: a FIFO that nobody reads fails here instead of blocking
     * bmt_init for ever; writes block again (on the plugin's thread only). */
    j->fd = open(j->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
    int flags = j->fd < 0 ? -1 : fcntl(j->fd, F_GETFL);
    if (flags < 0 || fcntl(j->fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        snprintf(err, len, "cannot open %.300s for appending: %s%s (BMT_JSONL)", j->path,
                 strerror(errno), errno == ENXIO ? ": a FIFO that nothing reads" : "");
        if (j->fd >= 0)
            close(j->fd);
        free(j);
        return -1;
    }
    j->q = pq_create((size_t)cap, sizeof(metrics_item_t));
    if (j->q == NULL || pthread_create(&j->thread, NULL, run, j) != 0) {
        snprintf(err, len, "cannot start its thread");
        pq_destroy(j->q);
        close(j->fd);
        free(j);
        return -1;
    }
    *state = j;
    return 0;
}

static void jsonl_on_step(void *state, const bmt_step_metrics_t *m)
{
    struct jsonl *j = state;
    metrics_item_t it;
    metrics_item_step(&it, m);
    pq_push(j->q, &it);
}

static void jsonl_on_event(void *state, const bmt_event_t *ev)
{
    struct jsonl *j = state;
    metrics_item_t it;
    metrics_item_event(&it, ev);
    pq_push(j->q, &it);
}

static void jsonl_on_scalar(void *state, const bmt_scalar_t *sc)
{
    struct jsonl *j = state;
    metrics_item_t it;
    metrics_item_scalar(&it, sc);
    pq_push(j->q, &it);
}

static void jsonl_finalize(void *state)
{
    struct jsonl *j = state;
    if (j == NULL)
        return;
    pq_close(j->q);
    pthread_join(j->thread, NULL);
    uint64_t dropped = pq_dropped(j->q);
    if (dropped)
        fprintf(stderr, "bmt: rank %d: jsonl: %llu lines were dropped (the disk was too slow)\n",
                j->rank, (unsigned long long)dropped);
    if (j->lost)
        fprintf(stderr, "bmt: rank %d: jsonl: %llu lines are not in %s: %s\n", j->rank,
                (unsigned long long)j->lost, j->path, j->fail_why);
    /* A network file system may say only now that the lines did not land. */
    if (fsync(j->fd) < 0 && errno != EINVAL && errno != EROFS) {
        char why[160];
        snprintf(why, sizeof(why), "fsync: %s (its last lines may not be on disk)",
                 strerror(errno));
        if (!j->write_failed)
            stop_writing(j, why);
    }
    if (close(j->fd) < 0 && !j->write_failed) {
        char why[160];
        snprintf(why, sizeof(why), "close: %s (its last lines may not be on disk)",
                 strerror(errno));
        stop_writing(j, why);
    }
    pq_destroy(j->q);
    free(j);
}

BMT_PLUGIN_EXPORT const bmt_monitor_plugin_v1_t bmt_monitor_plugin_v1 = {
    sizeof(bmt_monitor_plugin_v1_t),
    BMT_PLUGIN_ABI_VERSION,
    "jsonl",
    jsonl_init,
    jsonl_on_step,
    jsonl_on_event,
    jsonl_finalize,
    jsonl_on_scalar,
};
