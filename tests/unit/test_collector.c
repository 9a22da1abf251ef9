/* tests/unit/test_collector.c — bmlaunch's metrics collector without a socket.
 *
 * Pushes go straight to collector_ingest; /metrics and /api/status come from
 * the render functions. Checked: the token, every kind of malformed push (and
 * that a refused push changes nothing), aggregation per job and per group, the
 * step history (complete steps, skipped-step repeats), per-rank series on
 * request, label escaping of a hostile job id, and the push counters.
 * tests/integration/test_monitor.sh drives the same code over HTTP, with
 * promtool, Prometheus and Chromium.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collector.h"
#include "tap.h"

#define TOKEN "0123456789abcdef"
#define AUTH "Bearer " TOKEN

static collector_t *make(const char *job, int groups, int per_group, bool per_rank)
{
    static bmt_layout_t l;
    bmt_error_t err;
    if (bmt_layout_make(&l, groups, per_group, 0, 0, &err) < 0)
        return NULL;
    collector_opts_t o = {
        .job_id = job, .layout = &l, .device = "cpu", .per_rank = per_rank, .token = TOKEN
    };
    return collector_create(&o, &err);
}

/* A push of one step for rank r. */
static int push(collector_t *c, const char *job, int r, long step, double tps, double loss,
                char *why)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"version\":1,\"job\":\"%s\",\"rank\":%d,\"host\":\"h%d\",\"dropped\":%d,"
             "\"steps\":[{\"step\":%ld,\"time\":%ld,\"step_time_s\":0.5,\"tokens\":100,"
             "\"tokens_total\":%ld,\"tokens_per_s\":%g,\"loss\":%g,\"mfu\":0.25,"
             "\"flops_per_s\":1e12,\"comm_wait_s\":0.01,\"params\":1000,"
             "\"memory\":{\"param\":{\"current\":%d,\"peak\":%d}}}]}",
             job, r, r, r, step, 1000 + step, 100 * step, tps, loss, 1000 * (r + 1),
             2000 * (r + 1));
    return collector_ingest(c, AUTH, body, strlen(body), why, 300);
}

/* The value of the sample line that starts with prefix ("name{labels}"), or NaN. */
static double sample(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return NAN;
}

static void check_refusals(void)
{
    collector_t *c = make("job1", 2, 2, false);
    char why[300];
    static const struct {
        const char *auth, *body;
        int code;
        const char *why;
    } t[] = {
        { NULL, "{}", 401, "missing or wrong bearer token" },
        { "Bearer wrong", "{}", 401, "missing or wrong bearer token" },
        { "Bearer " TOKEN "x", "{}", 401, "missing or wrong bearer token" },
        { "Basic " TOKEN, "{}", 401, "missing or wrong bearer token" },
        { AUTH, "{\"version\":1,", 400, "malformed JSON" },
        { AUTH, "", 400, "malformed JSON" },
        { AUTH, "[1,2]", 400, "the body must be a JSON object" },
        { AUTH, "{\"version\":2,\"job\":\"job1\",\"rank\":0}", 400, "\"version\" must be 1" },
        { AUTH, "{\"version\":1,\"job\":\"other\",\"rank\":0}", 400,
          "\"job\" must be this job's id (job1)" },
        { AUTH, "{\"version\":1,\"job\":\"job1\",\"rank\":4}", 400,
          "\"rank\" must be an integer in [0, 4)" },
        { AUTH, "{\"version\":1,\"job\":\"job1\",\"rank\":-1}", 400, "\"rank\" must be" },
        { AUTH, "{\"version\":1,\"job\":\"job1\",\"rank\":\"0\"}", 400, "\"rank\" must be" },
        { AUTH, "{\"version\":1,\"job\":\"job1\",\"rank\":0,\"steps\":{}}", 400,
          "\"steps\" and \"events\" must be arrays" },
        { AUTH, "{\"version\":1,\"job\":\"job1\",\"rank\":0,\"dropped\":-5}", 400,
          "\"dropped\" must be a count" },
        { AUTH,
          "{\"version\":1,\"job\":\"job1\",\"rank\":0,\"steps\":[{\"step\":1},{\"step\":\"x\"}]}",
          400, "steps[1]: field \"step\" must be an integer" },
        { AUTH, "{\"version\":1,\"job\":\"job1\",\"rank\":0,\"events\":[{\"kind\":\"boom\"}]}", 400,
          "events[0]: unknown event kind \"boom\"" },
        { AUTH, "{\"version\":1,\"version\":1,\"job\":\"job1\",\"rank\":0}", 400,
          "malformed JSON" },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        why[0] = '\0';
        int code = collector_ingest(c, t[i].auth, t[i].body, strlen(t[i].body), why, sizeof(why));
        ok(code == t[i].code && strstr(why, t[i].why), "refused with %d: %s -> %d \"%s\"",
           t[i].code, t[i].body, code, why);
    }
    /* The push with one bad step of two changed nothing: rank 0 was never seen. */
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(m && sample(m, "bmt_ranks_reporting{job=\"job1\"}") == 0 &&
           sample(m, "bmt_tokens_total{job=\"job1\"}") == 0,
       "refused pushes changed nothing");
    ok(sample(m, "bmt_collector_pushes_total{job=\"job1\",code=\"401\"}") == 4 &&
           sample(m, "bmt_collector_pushes_total{job=\"job1\",code=\"400\"}") == 13 &&
           sample(m, "bmt_collector_pushes_total{job=\"job1\",code=\"200\"}") == 0,
       "refusals counted by status");
    free(m);
    collector_count(c, 413);
    collector_count(c, 405);
    collector_count(c, 999); /* not a status we count */
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_collector_pushes_total{job=\"job1\",code=\"413\"}") == 1 &&
           sample(m, "bmt_collector_pushes_total{job=\"job1\",code=\"405\"}") == 1,
       "413 and 405 counted");
    free(m);
    collector_destroy(c);
}

static void check_aggregates(void)
{
    collector_t *c = make("job2", 2, 2, false);
    char why[300] = "";
    int bad = 0;
    /* steps 1..3 from every rank; rank r has r+1 times the base throughput */
    for (long s = 1; s <= 3; s++)
        for (int r = 0; r < 4; r++)
            bad += push(c, "job2", r, s, 100.0 * (r + 1) * s, 2.0 + r, why) != 200;
    ok(bad == 0, "12 good pushes accepted (%s)", why);
    /* rank 3 moves on alone to step 4 */
    push(c, "job2", 3, 4, 1000, 9, why);
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(m != NULL && len == strlen(m), "metrics rendered (%zu bytes)", len);
    ok(sample(m, "bmt_tokens_per_second{job=\"job2\"}") == 300 + 600 + 900 + 1000,
       "job tokens/s: the sum of the ranks' latest (%g)",
       sample(m, "bmt_tokens_per_second{job=\"job2\"}"));
    ok(sample(m, "bmt_group_tokens_per_second{job=\"job2\",group=\"0\"}") == 900 &&
           sample(m, "bmt_group_tokens_per_second{job=\"job2\",group=\"1\"}") == 1900,
       "group tokens/s: the sum over the group's ranks");
    ok(sample(m, "bmt_step{job=\"job2\"}") == 3 &&
           sample(m, "bmt_group_step{job=\"job2\",group=\"1\"}") == 3,
       "step: the last one every rank reported");
    ok(sample(m, "bmt_loss{job=\"job2\"}") == (2.0 + 3.0 + 4.0 + 9.0) / 4, "loss: the mean");
    ok(sample(m, "bmt_mfu_ratio{job=\"job2\"}") == 0.25, "mfu: the mean");
    ok(sample(m, "bmt_tokens_total{job=\"job2\"}") == 300 + 300 + 300 + 400,
       "tokens_total: the sum of the ranks' totals");
    ok(sample(m, "bmt_memory_bytes{job=\"job2\",kind=\"param\"}") == 4000 &&
           sample(m, "bmt_memory_peak_bytes{job=\"job2\",kind=\"param\"}") == 8000,
       "memory: the most of any rank");
    ok(sample(m, "bmt_push_dropped_total{job=\"job2\"}") == 0 + 1 + 2 + 3,
       "dropped: the sum of what the ranks said");
    ok(sample(m, "bmt_ranks_reporting{job=\"job2\"}") == 4 &&
           sample(m, "bmt_ranks_alive{job=\"job2\"}") == 4,
       "4 reporting, 4 alive");
    ok(strstr(m, "bmt_rank_") == NULL, "no per-rank series unless asked");
    ok(strstr(m, "# TYPE bmt_tokens_total counter\n") && strstr(m, "# TYPE bmt_loss gauge\n"),
       "TYPE lines");
    free(m);

    char *s = collector_status_json(c, true, &len);
    json_error_t je;
    json_t *st = json_loads(s, 0, &je);
    free(s);
    ok(st != NULL, "status is JSON");
    json_t *hist = json_object_get(st, "history");
    ok(json_array_size(hist) == 3, "history: steps 1-3 complete, step 4 still assembling (%zu)",
       json_array_size(hist));
    json_t *h2 = json_array_get(hist, 1);
    ok(json_integer_value(json_object_get(h2, "step")) == 2 &&
           json_integer_value(json_object_get(h2, "ranks")) == 4 &&
           json_number_value(json_object_get(h2, "tokens_per_second")) == 2000 &&
           json_number_value(json_object_get(h2, "loss")) == 3.5,
       "history point of step 2: 4 ranks, tokens/s summed, loss averaged");
    const char *keys[] = { "step",
                           "loss",
                           "ranks",
                           "time",
                           "tokens_per_second",
                           "mfu",
                           "flops_per_second",
                           "step_time_seconds",
                           "comm_wait_seconds" };
    bool all = json_object_size(h2) == sizeof(keys) / sizeof(keys[0]);
    for (size_t k = 0; all && k < sizeof(keys) / sizeof(keys[0]); k++)
        all = json_object_get(h2, keys[k]) != NULL;
    ok(all && fabs(json_number_value(json_object_get(h2, "comm_wait_seconds")) - 0.01) < 1e-12,
       "history point: exactly its %zu fields, comm_wait_seconds among them (0.01 s, the ranks' "
       "mean; issue 26: it was missing and its value leaked)",
       sizeof(keys) / sizeof(keys[0]));
    ok(json_array_size(json_object_get(st, "groups")) == 2 &&
           json_array_size(json_object_get(st, "ranks")) == 4,
       "status: 2 groups, 4 ranks on request");
    ok(strcmp(json_string_value(json_object_get(st, "state")), "running") == 0, "state running");
    json_decref(st);
    /* Many requests: under ASAN=1 (make check-sanitize) LeakSanitizer fails
     * this program at exit if a request leaks anything. */
    size_t total = 0;
    for (int k = 0; k < 300; k++) {
        char *t = collector_status_json(c, true, &len);
        total += t ? len : 0;
        free(t);
    }
    ok(total > 0, "300 status requests answered (%zu bytes)", total);

    /* A skipped step repeats its step number: it must not count twice. */
    for (int r = 0; r < 3; r++)
        push(c, "job2", r, 4, 10, 1, why);
    push(c, "job2", 0, 4, 10, 1, why);
    s = collector_status_json(c, false, &len);
    st = json_loads(s, 0, &je);
    free(s);
    hist = json_object_get(st, "history");
    ok(json_array_size(hist) == 4 &&
           json_integer_value(json_object_get(json_array_get(hist, 3), "ranks")) == 4,
       "step 4 complete once with 4 ranks, the repeat ignored");
    ok(json_object_get(st, "ranks") == NULL, "no per-rank list unless asked");
    json_decref(st);

    collector_rank_exited(c, 2);
    collector_rank_exited(c, 2);
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_ranks_alive{job=\"job2\"}") == 3 &&
           sample(m, "bmt_ranks_reporting{job=\"job2\"}") == 3,
       "an exited rank is neither alive nor reporting (counted once)");
    free(m);
    collector_job_ended(c, 3);
    s = collector_status_json(c, false, &len);
    st = json_loads(s, 0, &je);
    free(s);
    ok(strcmp(json_string_value(json_object_get(st, "state")), "ended") == 0 &&
           json_integer_value(json_object_get(st, "exit_status")) == 3,
       "state ended with the exit status");
    json_decref(st);
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_job_running{job=\"job2\"}") == 0 &&
           sample(m, "bmt_tokens_per_second{job=\"job2\"}") == 0,
       "after the end: not running, no throughput");
    free(m);
    collector_destroy(c);
}

static void check_per_rank_and_labels(void)
{
    const char *job = "we\"ird\\job\nid";
    collector_t *c = make(job, 1, 2, true);
    char why[300] = "";
    char body[512];
    json_t *doc = json_pack("{sisssis[{sIsf}]}", "version", 1, "job", job, "rank", 1, "steps",
                            "step", (json_int_t)5, "tokens_per_s", 42.0);
    char *text = json_dumps(doc, 0);
    snprintf(body, sizeof(body), "%s", text);
    free(text);
    json_decref(doc);
    int code = collector_ingest(c, AUTH, body, strlen(body), why, sizeof(why));
    ok(code == 200, "a job id with quote, backslash and newline pushes fine (%s)", why);
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(strstr(m, "bmt_rank_tokens_per_second{job=\"we\\\"ird\\\\job\\nid\",group=\"0\",rank=\"1\"} "
                 "42\n") != NULL,
       "per-rank series with the label escaped");
    ok(strstr(m, "rank=\"0\"") == NULL, "a rank that never pushed has no series");
    ok(strchr(m, '\r') == NULL && strstr(m, "job\nid") == NULL, "no raw newline in a label");
    free(m);
    collector_destroy(c);
}

static void check_token(void)
{
    bmt_layout_t l;
    bmt_error_t err;
    bmt_layout_make(&l, 1, 1, 0, 0, &err);
    collector_opts_t o = { .job_id = "j", .layout = &l };
    collector_t *a = collector_create(&o, &err), *b = collector_create(&o, &err);
    const char *ta = collector_token(a);
    ok(strlen(ta) == 64 && strspn(ta, "0123456789abcdef") == 64, "a random token of 64 hex digits");
    ok(strcmp(ta, collector_token(b)) != 0, "two collectors, two tokens");
    collector_destroy(a);
    collector_destroy(b);
    collector_destroy(NULL);
    ok(1, "collector_destroy(NULL) is a no-op");
}

int main(void)
{
    check_refusals();
    check_aggregates();
    check_per_rank_and_labels();
    check_token();
    return done_testing();
}
