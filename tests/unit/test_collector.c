/* tests/unit/test_collector.c — bmlaunch's metrics collector without a socket.
 *
 * Pushes go straight to collector_ingest; /metrics and /api/status come from
 * the render functions. Checked: the token, every kind of malformed push (and
 * that a refused push changes nothing), aggregation per job and per group, the
 * step history (complete steps, skipped-step repeats), per-rank series on
 * request, label escaping of a hostile job id, and the push counters; the
 * values of a push (impossible ones and steps far from the job's refused, and
 * such a push changes nothing), the last figures kept after the end with the
 * job's state and its failed ranks, the collector's connection limits,
 * scalars (val_loss and a program's own, with the bound on their names, the
 * newest by step kept); runs: a late push of an earlier run after a restart
 * (409, counted, never the window of steps), a rank's newer process replacing
 * its older one, a silent rank that no longer holds the window; the ranges
 * (an event's 32-bit status, dropped counts that never wrap) and the step time
 * of a job nobody reports for (NaN).
 * tests/integration/test_monitor.sh drives the same code over HTTP, with
 * promtool, Prometheus and Chromium.
 */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collector.h"
#include "tap.h"

#define TOKEN "0123456789abcdef"
#define AUTH "Bearer " TOKEN
/* Rank 0's process in the first run, and the start of a push of it. */
#define RUN0 "{\"restart\":0,\"start\":1000.5,\"id\":\"00000000000000a0\"}"
#define DOC0(job) "{\"version\":2,\"job\":\"" job "\",\"rank\":0,\"run\":" RUN0

/* The run the pushes of push() and push_scalars() name: rank r's process is
 * {g_restart, 1000.5 + g_start, id r + 0xa0} (a test moves these on to make a
 * restart of the job or of a rank). */
static long g_restart;
static double g_start;

static const char *run_of(int r, char *buf, size_t len)
{
    snprintf(buf, len, "{\"restart\":%ld,\"start\":%.6f,\"id\":\"%016x\"}", g_restart,
             1000.5 + g_start, (unsigned)r + 0xa0);
    return buf;
}

static collector_t *make(const char *job, int groups, int per_group, bool per_rank)
{
    static bmt_layout_t l;
    bmt_error_t err;
    g_restart = 0, g_start = 0;
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
    char body[1024], run[128];
    snprintf(body, sizeof(body),
             "{\"version\":2,\"job\":\"%s\",\"rank\":%d,\"run\":%s,\"host\":\"h%d\","
             "\"dropped\":%d,"
             "\"steps\":[{\"step\":%ld,\"time\":%ld,\"step_time_s\":0.5,\"tokens\":100,"
             "\"tokens_total\":%ld,\"tokens_per_s\":%g,\"loss\":%g,\"mfu\":0.25,"
             "\"flops_per_s\":1e12,\"comm_wait_s\":0.01,\"params\":1000,"
             "\"memory\":{\"param\":{\"current\":%d,\"peak\":%d}}}]}",
             job, r, run_of(r, run, sizeof(run)), r, r, step, 1000 + step, 100 * step, tps, loss,
             1000 * (r + 1), 2000 * (r + 1));
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
        { AUTH, "{\"version\":3,\"job\":\"job1\",\"rank\":0}", 400, "\"version\" must be 2" },
        { AUTH, "{\"version\":2,\"job\":\"other\",\"rank\":0}", 400,
          "\"job\" must be this job's id (job1)" },
        { AUTH, "{\"version\":2,\"job\":\"job1\",\"rank\":4}", 400,
          "\"rank\" must be an integer in [0, 4)" },
        { AUTH, "{\"version\":2,\"job\":\"job1\",\"rank\":-1}", 400, "\"rank\" must be" },
        { AUTH, "{\"version\":2,\"job\":\"job1\",\"rank\":\"0\"}", 400, "\"rank\" must be" },
        { AUTH, DOC0("job1") ",\"steps\":{}}", 400,
          "\"steps\", \"events\" and \"scalars\" must be arrays" },
        { AUTH, DOC0("job1") ",\"dropped\":-5}", 400, "\"dropped\" must be a count" },
        { AUTH, DOC0("job1") ",\"steps\":[{\"step\":1},{\"step\":\"x\"}]}", 400,
          "steps[1]: field \"step\" must be an integer" },
        { AUTH, DOC0("job1") ",\"events\":[{\"kind\":\"boom\"}]}", 400,
          "events[0]: unknown event kind \"boom\"" },
        { AUTH, "{\"version\":2,\"version\":2,\"job\":\"job1\",\"rank\":0}", 400,
          "malformed JSON" },
        /* The run: a push names the process it comes from. */
        { AUTH, "{\"version\":1,\"job\":\"job1\",\"rank\":0}", 400,
          "\"version\" 1 is the push protocol without run identities: this bmlaunch takes "
          "version 2" },
        { AUTH, "{\"version\":2,\"job\":\"job1\",\"rank\":0,\"steps\":[{\"step\":1}]}", 400,
          "\"run\" is missing: every push names the process it comes from" },
        { AUTH, "{\"version\":2,\"job\":\"job1\",\"rank\":0,\"run\":\"x\"}", 400,
          "\"run\" must be an object" },
        { AUTH,
          "{\"version\":2,\"job\":\"job1\",\"rank\":0,\"run\":{\"restart\":-1,\"start\":1,"
          "\"id\":\"00000000000000a0\"}}",
          400, "run field \"restart\" must be a count" },
        { AUTH,
          "{\"version\":2,\"job\":\"job1\",\"rank\":0,\"run\":{\"restart\":0,\"start\":0,"
          "\"id\":\"00000000000000a0\"}}",
          400, "run field \"start\" must be a positive number" },
        { AUTH,
          "{\"version\":2,\"job\":\"job1\",\"rank\":0,\"run\":{\"restart\":0,\"start\":1,"
          "\"id\":\"00000000000000A0\"}}",
          400, "run field \"id\" must be 16 lower-case hex digits" },
        { AUTH,
          "{\"version\":2,\"job\":\"job1\",\"rank\":0,\"run\":{\"restart\":1,\"start\":1,"
          "\"id\":\"00000000000000a0\"}}",
          400, "run: \"restart\" 1 is a run bmlaunch has not started (it started run 0 last" },
        /* A member it does not know would be ignored: refused. */
        { AUTH, DOC0("job1") ",\"step\":[{\"step\":1}]}", 400,
          "unknown member \"step\" (a push has version, job, rank, run, host, device_name, "
          "peak_flops, dropped, steps, events and scalars)" },
        /* Counts that could wrap, and an event status cut to 32 bits. */
        { AUTH, DOC0("job1") ",\"dropped\":9007199254740993}", 400,
          "\"dropped\" must be a count from 0 to 2^53 (9007199254740992)" },
        { AUTH, DOC0("job1") ",\"events\":[{\"kind\":\"abort\",\"status\":4294967297}]}", 400,
          "events[0]: event field \"status\" must be a 32-bit integer (4294967297)" },
        { AUTH, DOC0("job1") ",\"events\":[{\"kind\":\"abort\",\"status\":-2147483649}]}", 400,
          "events[0]: event field \"status\" must be a 32-bit integer (-2147483649)" },
        { AUTH, DOC0("job1") ",\"events\":[{\"kind\":\"note\",\"step\":-1}]}", 400,
          "events[0]: field \"step\" must not be negative (-1)" },
        { "Bearer", "{}", 401, "missing or wrong bearer token" },
        { "Bearer" TOKEN, "{}", 401, "missing or wrong bearer token" },
    /* Impossible values (issue 21, item 9): JSON has no NaN or infinity,
     * so null is the non-finite value a push can carry. */
#define STEP1(x) DOC0("job1") ",\"steps\":[{\"step\":1," x "}]}"
        { AUTH, STEP1("\"tokens_per_s\":null"), 400,
          "steps[0]: field \"tokens_per_s\" must be a finite number: null (NaN or infinity) is "
          "allowed only for loss" },
        { AUTH, STEP1("\"step_time_s\":null"), 400, "field \"step_time_s\" must be a finite" },
        { AUTH, STEP1("\"time\":null"), 400, "field \"time\" must be a finite" },
        { AUTH, STEP1("\"comm_wait_s\":-0.5"), 400,
          "field \"comm_wait_s\" must not be negative (-0.5)" },
        { AUTH, STEP1("\"mfu\":-1"), 400, "field \"mfu\" must not be negative" },
        { AUTH, STEP1("\"lr\":-0.1"), 400, "field \"lr\" must not be negative" },
        { AUTH, STEP1("\"tokens_total\":-5"), 400,
          "steps[0]: field \"tokens_total\" is a count and must not be negative (-5)" },
        { AUTH, STEP1("\"params\":-1"), 400, "field \"params\" is a count and must not be" },
        { AUTH, STEP1("\"skipped\":2"), 400, "field \"skipped\" must be 0 or 1 (2)" },
        { AUTH, STEP1("\"tokens\":100,\"tokens_total\":50"), 400,
          "a total is less than the step's own count (tokens_total 50, tokens 100" },
        { AUTH, DOC0("job1") ",\"steps\":[{\"step\":-1}]}", 400,
          "steps[0]: field \"step\" is a count and must not be negative (-1)" },
#undef STEP1
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
    ok(m && sample(m, "bmt_ranks_reporting{job_id=\"job1\"}") == 0 &&
           sample(m, "bmt_tokens_total{job_id=\"job1\"}") == 0,
       "refused pushes changed nothing");
    ok(sample(m, "bmt_collector_pushes_total{job_id=\"job1\",code=\"401\"}") == 6 &&
           sample(m, "bmt_collector_pushes_total{job_id=\"job1\",code=\"400\"}") == 36 &&
           sample(m, "bmt_collector_pushes_total{job_id=\"job1\",code=\"200\"}") == 0 &&
           sample(m, "bmt_collector_pushes_total{job_id=\"job1\",code=\"409\"}") == 0 &&
           sample(m, "bmt_push_old_run_items_total{job_id=\"job1\"}") == 0,
       "refusals counted by status (409, for old runs, there from the start)");
    free(m);
    collector_count(c, 413);
    collector_count(c, 405);
    collector_count(c, 999); /* not a status we count */
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_collector_pushes_total{job_id=\"job1\",code=\"413\"}") == 1 &&
           sample(m, "bmt_collector_pushes_total{job_id=\"job1\",code=\"405\"}") == 1,
       "413 and 405 counted");
    free(m);
    collector_destroy(c);

    /* Any finite figure is the job's to report (a diverging loss, an absurd
     * rate): accepted, not refused with the rest of its push. */
    c = make("big", 1, 1, false);
    why[0] = '\0';
    int code = push(c, "big", 0, 1, 1e308, -2e30, why);
    m = c ? collector_metrics_text(c, &len) : NULL;
    ok(code == 200 && m && sample(m, "bmt_loss{job_id=\"big\"}") == -2e30,
       "a step with tokens_per_s 1e308 and loss -2e30 is accepted and shown (%d %s)", code, why);
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
    ok(sample(m, "bmt_tokens_per_second{job_id=\"job2\"}") == 300 + 600 + 900 + 1000,
       "job tokens/s: the sum of the ranks' latest (%g)",
       sample(m, "bmt_tokens_per_second{job_id=\"job2\"}"));
    ok(sample(m, "bmt_group_tokens_per_second{job_id=\"job2\",group=\"0\"}") == 900 &&
           sample(m, "bmt_group_tokens_per_second{job_id=\"job2\",group=\"1\"}") == 1900,
       "group tokens/s: the sum over the group's ranks");
    ok(sample(m, "bmt_step{job_id=\"job2\"}") == 3 &&
           sample(m, "bmt_group_step{job_id=\"job2\",group=\"1\"}") == 3,
       "step: the last one every rank reported");
    ok(sample(m, "bmt_loss{job_id=\"job2\"}") == (2.0 + 3.0 + 4.0 + 9.0) / 4, "loss: the mean");
    ok(sample(m, "bmt_mfu_ratio{job_id=\"job2\"}") == 0.25, "mfu: the mean");
    ok(sample(m, "bmt_tokens_total{job_id=\"job2\"}") == 300 + 300 + 300 + 400,
       "tokens_total: the sum of the ranks' totals");
    ok(sample(m, "bmt_memory_bytes{job_id=\"job2\",kind=\"param\"}") == 4000 &&
           sample(m, "bmt_memory_peak_bytes{job_id=\"job2\",kind=\"param\"}") == 8000,
       "memory: the most of any rank");
    ok(sample(m, "bmt_push_dropped_total{job_id=\"job2\"}") == 0 + 1 + 2 + 3,
       "dropped: the sum of what the ranks said");
    ok(sample(m, "bmt_ranks_reporting{job_id=\"job2\"}") == 4 &&
           sample(m, "bmt_ranks_alive{job_id=\"job2\"}") == 4,
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

    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_job_state{job_id=\"job2\",state=\"running\"}") == 1 &&
           sample(m, "bmt_ranks_failed{job_id=\"job2\"}") == 0 &&
           strstr(m, "bmt_job_exit_code") == NULL && strstr(m, "bmt_rank_exit_") == NULL,
       "while running: state running, no exit code, no failed rank");
    free(m);
    collector_rank_exited(c, 2, 0, 0);
    collector_rank_exited(c, 2, 0, 0);
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_ranks_alive{job_id=\"job2\"}") == 3 &&
           sample(m, "bmt_ranks_reporting{job_id=\"job2\"}") == 3,
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
    /* Issue 21, item 7: a scrape after the end sees the last figures. Every
     * rank's last step was 4, at 10 tokens/s and loss 1 (rank 3's: 1000, 9). */
    ok(sample(m, "bmt_job_running{job_id=\"job2\"}") == 0 &&
           sample(m, "bmt_tokens_per_second{job_id=\"job2\"}") == 10 + 10 + 10 + 1000 &&
           sample(m, "bmt_loss{job_id=\"job2\"}") == (1 + 1 + 1 + 9) / 4.0 &&
           sample(m, "bmt_group_loss{job_id=\"job2\",group=\"1\"}") == (1 + 9) / 2.0 &&
           sample(m, "bmt_ranks_reporting{job_id=\"job2\"}") == 0,
       "after the end: not running, none reporting, the gauges keep every rank's last figures "
       "(tokens/s %g, loss %g)",
       sample(m, "bmt_tokens_per_second{job_id=\"job2\"}"), sample(m, "bmt_loss{job_id=\"job2\"}"));
    ok(sample(m, "bmt_job_state{job_id=\"job2\",state=\"failed\"}") == 1 &&
           sample(m, "bmt_job_state{job_id=\"job2\",state=\"running\"}") == 0 &&
           sample(m, "bmt_job_state{job_id=\"job2\",state=\"succeeded\"}") == 0 &&
           sample(m, "bmt_job_exit_code{job_id=\"job2\"}") == 3,
       "after the end: state failed, exit code 3");
    free(m);
    collector_destroy(c);
}

static void check_per_rank_and_labels(void)
{
    const char *job = "we\"ird\\job\nid";
    collector_t *c = make(job, 1, 2, true);
    char why[300] = "";
    char body[512];
    json_t *doc = json_pack("{sisssis{sisfss}s[{sIsf}]}", "version", 2, "job", job, "rank", 1,
                            "run", "restart", 0, "start", 1000.5, "id", "00000000000000a1", "steps",
                            "step", (json_int_t)5, "tokens_per_s", 42.0);
    char *text = json_dumps(doc, 0);
    snprintf(body, sizeof(body), "%s", text);
    free(text);
    json_decref(doc);
    int code = collector_ingest(c, AUTH, body, strlen(body), why, sizeof(why));
    ok(code == 200, "a job id with quote, backslash and newline pushes fine (%s)", why);
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(strstr(m,
              "bmt_rank_tokens_per_second{job_id=\"we\\\"ird\\\\job\\nid\",group=\"0\",rank=\"1\"} "
              "42\n") != NULL,
       "per-rank series with the label escaped");
    ok(strstr(m, "rank=\"0\"") == NULL, "a rank that never pushed has no series");
    ok(strchr(m, '\r') == NULL && strstr(m, "job\nid") == NULL, "no raw newline in a label");
    free(m);
    collector_destroy(c);
}

/* The status JSON's history as "step:ranks,..." (and its length). */
static void history_of(collector_t *c, char *out, size_t n, size_t *points)
{
    size_t len;
    char *s = collector_status_json(c, false, &len);
    json_error_t je;
    json_t *st = json_loads(s, 0, &je), *h = json_object_get(st, "history");
    free(s);
    out[0] = '\0';
    *points = json_array_size(h);
    for (size_t i = 0, o = 0; i < json_array_size(h) && o < n; i++) {
        json_t *p = json_array_get(h, i);
        o += (size_t)snprintf(out + o, n - o, "%lld:%lld,",
                              (long long)json_integer_value(json_object_get(p, "step")),
                              (long long)json_integer_value(json_object_get(p, "ranks")));
    }
    json_decref(st);
}

/* Issue 21, item 9: a rank's step far from the job's is refused with 400, the
 * push changes nothing, and the history keeps growing. */
static void check_far_steps(void)
{
    collector_t *c = make("job3", 1, 2, false);
    char why[300] = "";
    int bad = 0;
    for (long s = 1; s <= 5; s++)
        for (int r = 0; r < 2; r++)
            bad += push(c, "job3", r, s, 100, 2, why) != 200;
    ok(bad == 0, "steps 1-5 of 2 ranks accepted (%s)", why);
    char before[4096], after[4096];
    size_t n0, n1, len;
    history_of(c, before, sizeof(before), &n0);
    char *m0 = collector_metrics_text(c, &len);

    int code = push(c, "job3", 1, 1000000, 100, 2, why);
    ok(code == 400 &&
           strstr(why, "steps[0]: step 1000000 is far from the job's (its highest step "
                       "so far is 5; a push may be at most 1000 steps ahead of it") != NULL,
       "step 1,000,000 of a job at step 5: 400 (%s)", why);
    code = push(c, "job3", 0, 1006, 100, 2, why);
    ok(code == 400 && strstr(why, "step 1006 is far"), "1001 steps ahead: 400");
    /* One good step and one far: nothing of the push is applied. */
    const char *two = DOC0("job3") ",\"steps\":[{\"step\":6,"
                                   "\"tokens_per_s\":5e5,\"loss\":7},{\"step\":900000}]}";
    code = collector_ingest(c, AUTH, two, strlen(two), why, sizeof(why));
    ok(code == 400 && strstr(why, "steps[1]: step 900000 is far"),
       "a push of step 6 and step 900000: 400 for steps[1] (%s)", why);
    history_of(c, after, sizeof(after), &n1);
    char *m1 = collector_metrics_text(c, &len);
    /* Only the push counters may differ. */
    char *p0 = strstr(m0, "# HELP bmt_collector_pushes_total"),
         *p1 = strstr(m1, "# HELP bmt_collector_pushes_total");
    char *q0 = p0 ? strstr(p0, "# HELP bmt_group") : NULL,
         *q1 = p1 ? strstr(p1, "# HELP bmt_group") : NULL;
    ok(strcmp(before, after) == 0 && p0 && p1 && q0 && q1 && p0 - m0 == p1 - m1 &&
           strncmp(m0, m1, (size_t)(p0 - m0)) == 0 && strcmp(q0, q1) == 0,
       "the refused pushes changed neither the history (%s) nor /metrics", after);
    ok(sample(m1, "bmt_collector_pushes_total{job_id=\"job3\",code=\"400\"}") == 3,
       "3 refusals counted");
    free(m0);
    free(m1);
    /* The history is not frozen: steps 6-8 complete with both ranks. */
    bad = 0;
    for (long s = 6; s <= 8; s++)
        for (int r = 0; r < 2; r++)
            bad += push(c, "job3", r, s, 100, 2, why) != 200;
    history_of(c, after, sizeof(after), &n1);
    ok(bad == 0 && n1 == 8 && strstr(after, "6:2,7:2,8:2,"), "then steps 6-8 complete: %s", after);
    ok(push(c, "job3", 0, 1008, 100, 2, why) == 200, "1000 steps ahead is near enough (%s)", why);
    ok(push(c, "job3", 1, 9, 100, 2, why) == 200, "a rank behind the leader by 999 too (%s)", why);

    /* A restart may resume from a checkpoint of any step. */
    collector_job_restarted(c, 1, "rank 0 (pid 1 on h) exited with code 1");
    g_restart = 1; /* the new run's processes say so */
    ok(push(c, "job3", 0, 50000, 100, 2, why) == 200 &&
           push(c, "job3", 1, 50000, 100, 2, why) == 200,
       "after a restart, step 50000 is the job's (%s)", why);
    ok(push(c, "job3", 1, 48000, 100, 2, why) == 400 &&
           strstr(why, "at most 1000 steps ahead of it and 1000 behind"),
       "and step 48000 is 2000 behind it (%s)", why);

    /* Pushes held back catch up: at the run's rate (steps 50000 to 51000 over
     * at least 1 s) twice the time since the leading step is allowed more. */
    ok(push(c, "job3", 0, 51000, 100, 2, why) == 200, "step 51000");
    struct timespec ts = { 0, 400 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    ok(push(c, "job3", 0, 52500, 100, 2, why) == 200,
       "0.4 s later at up to 1000 steps/s, step 52500 catches up (%s)", why);
    ok(push(c, "job3", 0, 1000000, 100, 2, why) == 400, "but not step 1,000,000");
    collector_destroy(c);
}

/* Issue 21, item 7: the end of a job and its failed ranks, bounded. */
static void check_failures(void)
{
    collector_t *c = make("job4", 1, 4, false);
    char why[300] = "";
    for (int r = 0; r < 2; r++) /* ranks 2 and 3 never push */
        push(c, "job4", r, 1, 100, 2.5, why);
    /* rank 3 ended by bmlaunch (its SIGTERM after rank 1's failure): no failure */
    collector_rank_exited(c, 3, SIGTERM, SIGTERM);
    collector_rank_exited(c, 1, 7 << 8, 0); /* exit(7) */
    collector_rank_exited(c, 2, SIGKILL, 0);
    collector_rank_exited(c, 0, 0, 0);
    collector_job_ended(c, 7);
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    char want[200];
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_ranks_failed{job_id=\"job4\"}") == 2 &&
           sample(m, "bmt_rank_exit_code{job_id=\"job4\",rank=\"1\",host=\"h1\"}") == 7,
       "rank 1 failed with code 7, on the host it pushed from");
    snprintf(want, sizeof(want), "bmt_rank_exit_signal{job_id=\"job4\",rank=\"2\",host=\"%s\"}",
             host);
    ok(sample(m, want) == 9, "rank 2 killed by signal 9, on our host (it never pushed): %s", want);
    ok(strstr(m, "rank=\"0\"") == NULL, "rank 0 exited 0: not failed");
    ok(strstr(m, "rank=\"3\"") == NULL, "rank 3, ended by bmlaunch's SIGTERM: not failed");
    ok(sample(m, "bmt_job_exit_code{job_id=\"job4\"}") == 7 &&
           sample(m, "bmt_job_state{job_id=\"job4\",state=\"failed\"}") == 1 &&
           sample(m, "bmt_loss{job_id=\"job4\"}") == 2.5,
       "job failed with 7; the last loss kept");
    ok(sample(m, "bmt_events_total{job_id=\"job4\",kind=\"rank_failed\"}") == 2,
       "each failed rank is a rank_failed event");
    free(m);
    char *s = collector_status_json(c, false, &len);
    snprintf(want, sizeof(want), "\"detail\":\"rank 2 (on %s) was killed by signal 9 (SIGKILL)\"",
             host);
    ok(strstr(s, "\"kind\":\"rank_failed\"") &&
           strstr(s, "\"detail\":\"rank 1 (on h1) exited with code 7\"") && strstr(s, want) &&
           strstr(s, "\"rank\":2}"),
       "status: the rank_failed events name rank, host and cause");
    if (!strstr(s, want))
        diag("%s", s);
    ok(strstr(s, "\"ranks_failed\":2") &&
           strstr(s, "\"failed_ranks\":[{\"rank\":1,\"host\":\"h1\",\"exit_code\":7},{\"rank\":2,"),
       "status: the failed ranks");
    free(s);
    collector_destroy(c);

    /* 1000 ranks killed: 1000 counted, 16 named. */
    c = make("job5", 40, 25, false);
    for (int r = 0; r < 1000; r++)
        collector_rank_exited(c, r, SIGTERM, 0);
    collector_job_ended(c, 143);
    m = collector_metrics_text(c, &len);
    int named = 0;
    for (const char *p = m; (p = strstr(p, "\nbmt_rank_exit_signal{")) != NULL; p++)
        named++;
    ok(sample(m, "bmt_events_total{job_id=\"job5\",kind=\"rank_failed\"}") ==
           COLLECTOR_FAILED_SHOWN,
       "events for the first %d failed ranks only", COLLECTOR_FAILED_SHOWN);
    ok(sample(m, "bmt_ranks_failed{job_id=\"job5\"}") == 1000 && named == COLLECTOR_FAILED_SHOWN &&
           strstr(m, "rank=\"0\",") && strstr(m, "rank=\"15\",") && !strstr(m, "rank=\"16\","),
       "1000 failed ranks: counted, the first %d named (%d)", COLLECTOR_FAILED_SHOWN, named);
    free(m);
    collector_destroy(c);

    c = make("job6", 1, 2, false);
    collector_rank_exited(c, 0, 0, 0);
    collector_rank_exited(c, 1, 0, 0);
    collector_job_ended(c, 0);
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_job_state{job_id=\"job6\",state=\"succeeded\"}") == 1 &&
           sample(m, "bmt_job_exit_code{job_id=\"job6\"}") == 0 &&
           sample(m, "bmt_ranks_failed{job_id=\"job6\"}") == 0,
       "a clean end: succeeded, code 0, no failed rank");
    free(m);
    collector_destroy(c);
}

/* Issue 21, item 10: the scheme is case-insensitive (RFC 7235). */
static int fake_state(void *arg, int rank, char *buf, size_t len)
{
    (void)arg;
    if (rank != 1)
        return -1;
    snprintf(buf, len, "T (stopped)");
    return 0;
}

static void check_stale(void)
{
    ok(collector_stale_default(0) == COLLECTOR_STALE_MIN_S &&
           collector_stale_default(1) == COLLECTOR_STALE_MIN_S &&
           collector_stale_default(3) == 15 &&
           collector_stale_default(NAN) == COLLECTOR_STALE_MIN_S &&
           collector_stale_default(INFINITY) == COLLECTOR_STALE_MIN_S,
       "the default stale window: 5 step times, at least 10 s");
    static bmt_layout_t l;
    bmt_error_t err;
    bmt_layout_make(&l, 1, 4, 0, 0, &err);
    collector_opts_t o = { .job_id = "st",
                           .layout = &l,
                           .device = "cpu",
                           .token = TOKEN,
                           .stale_s = 0.3,
                           .proc_state = fake_state };
    collector_t *c = collector_create(&o, &err);
    char why[300] = "";
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_ranks_stale{job_id=\"st\"}") == 0 && !strstr(m, "bmt_rank_stale_seconds{"),
       "before any push nobody is stale (a job may take long to start)");
    free(m);
    push(c, "st", 0, 1, 100, 2, why);
    push(c, "st", 1, 1, 100, 2, why);
    push(c, "st", 3, 1, 100, 2, why);
    struct timespec ts = { 0, 400 * 1000000L };
    nanosleep(&ts, NULL);
    push(c, "st", 0, 2, 100, 2, why);
    collector_rank_exited(c, 3, 0, 0); /* exited: done, not stale */
    m = collector_metrics_text(c, &len);
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    char want[200];
    snprintf(want, sizeof(want),
             "bmt_rank_stale_seconds{job_id=\"st\",rank=\"2\",host=\"%s\",state=\"unknown\"}",
             host);
    double s1 = sample(m, "bmt_rank_stale_seconds{job_id=\"st\",rank=\"1\",host=\"h1\","
                          "state=\"T (stopped)\"}");
    ok(sample(m, "bmt_ranks_stale{job_id=\"st\"}") == 2 && s1 >= 0.4 && s1 < 30 &&
           sample(m, want) >= 0.4 && sample(m, "bmt_stale_window_seconds{job_id=\"st\"}") == 0.3,
       "rank 1 (no push for 0.4 s; its process stopped) and rank 2 (never pushed) are stale, "
       "named with host and state; rank 0 pushed, rank 3 exited");
    if (sample(m, "bmt_ranks_stale{job_id=\"st\"}") != 2 || !(s1 >= 0.4))
        diag("%s", m);
    ok(!strstr(m, "rank=\"0\",host=\"h0\",state") && !strstr(m, "rank=\"3\",host=\"h3\",state"),
       "rank 0 and rank 3 are not named stale");
    ok(sample(m, "bmt_ranks_reporting{job_id=\"st\"}") == 1, "only rank 0 counts as reporting");
    /* Stale means no step pushed: the help must not say "pushed nothing" (a
     * rank that pushes scalars or events alone is stale too). */
    ok(strstr(m, "# HELP bmt_ranks_stale running ranks that pushed no step for longer") &&
           strstr(m, "# HELP bmt_rank_stale_seconds seconds since a stale rank's last push of a "
                     "step") &&
           !strstr(m, "pushed nothing"),
       "the help of the stale series says what counts: a step pushed");
    free(m);
    char *s = collector_status_json(c, false, &len);
    ok(strstr(s, "\"ranks_stale\":2") && strstr(s, "\"stale_ranks\":[{\"rank\":1,\"host\":\"h1\","
                                                   "\"state\":\"T (stopped)\",\"seconds\":"),
       "status: the stale ranks by name");
    free(s);
    collector_job_ended(c, 0);
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_ranks_stale{job_id=\"st\"}") == 0, "after the end nobody is stale");
    free(m);
    collector_destroy(c);
}

/* The counters: every step once, between scrapes or not. */
static void check_counters(void)
{
    collector_t *c = make("cnt", 1, 2, false);
    char why[300] = "";
    for (long step = 1; step <= 3; step++)
        for (int r = 0; r < 2; r++)
            push(c, "cnt", r, step, 100, 2, why);
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_steps_total{job_id=\"cnt\"}") == 3 &&
           fabs(sample(m, "bmt_step_duration_seconds_total{job_id=\"cnt\"}") - 1.5) < 1e-12 &&
           fabs(sample(m, "bmt_comm_wait_seconds_total{job_id=\"cnt\"}") - 0.03) < 1e-12,
       "3 steps of 0.5 s with 0.01 s of waiting: counters 3, 1.5 s, 0.03 s");
    free(m);
    char *s = collector_status_json(c, false, &len);
    ok(strstr(s, "\"per_rank\":false") && strstr(s, "\"steps_total\":3"),
       "status: per_rank and steps_total");
    free(s);
    collector_destroy(c);
}

static int push_scalars(collector_t *c, int r, const char *scalars, char *why)
{
    char body[8192], run[128];
    snprintf(body, sizeof(body),
             "{\"version\":2,\"job\":\"sc\",\"rank\":%d,\"run\":%s,\"scalars\":[%s]}", r,
             run_of(r, run, sizeof(run)), scalars);
    return collector_ingest(c, AUTH, body, strlen(body), why, 300);
}

/* Scalars: val_loss and a program's own, their means, the bound on names, the
 * refusals (which change nothing), and the page's val_loss history. */
static void check_scalars(void)
{
    collector_t *c = make("sc", 1, 2, false);
    char why[300] = "";
    size_t len;
    char *m = collector_metrics_text(c, &len);
    ok(strstr(m, "bmt_val_loss") == NULL && strstr(m, "bmt_scalar") == NULL,
       "no scalar families before a scalar came");
    free(m);
    for (int r = 0; r < 2; r++)
        for (int step = 10; step <= 20; step += 10) {
            char x[512];
            snprintf(x, sizeof(x),
                     "{\"name\":\"val_loss\",\"value\":%g,\"step\":%d,\"time\":1},"
                     "{\"name\":\"bleu\",\"value\":%d,\"step\":%d,\"time\":1}",
                     3.0 - step / 10.0 + r, step, r + 1, step);
            ok(push_scalars(c, r, x, why) == 200, "rank %d, step %d: scalars accepted (%s)", r,
               step, why);
        }
    m = collector_metrics_text(c, &len);
    ok(fabs(sample(m, "bmt_val_loss{job_id=\"sc\"}") - 1.5) < 1e-12 &&
           sample(m, "bmt_val_loss_step{job_id=\"sc\"}") == 20,
       "bmt_val_loss: mean of the ranks' last values (1 and 2), at step 20");
    ok(sample(m, "bmt_scalar{job_id=\"sc\",name=\"bleu\"}") == 1.5 &&
           sample(m, "bmt_scalar_step{job_id=\"sc\",name=\"bleu\"}") == 20 &&
           strstr(m, "name=\"val_loss\"") == NULL,
       "bmt_scalar{name=\"bleu\"}: 1.5 at step 20; val_loss is not repeated as a bmt_scalar");
    free(m);
    char *s = collector_status_json(c, false, &len);
    ok(s &&
           strstr(s, "\"val_history\":[{\"step\":10,\"val_loss\":2.5},{\"step\":20,"
                     "\"val_loss\":1.5}]") &&
           strstr(s, "\"bleu\":{\"value\":1.5,\"step\":20}"),
       "status: val_history of two points, each a mean over the ranks; scalars by name");
    free(s);

    static const struct {
        const char *x, *why;
    } bad[] = {
        { "{\"name\":\"Val\",\"value\":1,\"step\":1}", "scalars[0]: name \"Val\" must be" },
        { "{\"name\":\"a b\",\"value\":1,\"step\":1}", "scalars[0]: name \"a b\" must be" },
        { "{\"name\":\"x\",\"value\":\"1\",\"step\":1}", "field \"value\" must be a number" },
        { "{\"name\":\"x\",\"value\":1,\"step\":-1}", "\"step\" must not be negative" },
        { "{\"value\":1}", "a scalar must be an object with a string \"name\"" },
        { "7", "a scalar must be an object" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int code = push_scalars(c, 0, bad[i].x, why);
        ok(code == 400 && strstr(why, bad[i].why), "refused: %s -> %d %s", bad[i].x, code, why);
    }
    /* 2 names so far: 30 more fit, and the push with a 31st is refused whole */
    char many[8192] = "";
    for (int i = 0; i < 31; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many),
                 "%s{\"name\":\"s%d\",\"value\":%d,\"step\":30}", i ? "," : "", i, i);
    int code = push_scalars(c, 0, many, why);
    ok(code == 400 && strstr(why, "\"s30\" would be one name too many: a job has at most 32 "
                                  "scalar names (it has 2)"),
       "a push that brings the job to 33 names is refused: %d %s", code, why);
    m = collector_metrics_text(c, &len);
    ok(strstr(m, "name=\"s0\"") == NULL, "and none of its names was kept");
    free(m);
    *strstr(many, ",{\"name\":\"s30\"") = '\0'; /* s0..s29: 32 names in all */
    code = push_scalars(c, 1, many, why);
    ok(code == 200, "30 new names: 32 in all, accepted (%s)", why);
    ok(push_scalars(c, 0, "{\"name\":\"one_more\",\"value\":1,\"step\":40}", why) == 400 &&
           push_scalars(c, 0, "{\"name\":\"s29\",\"value\":null,\"step\":40}", why) == 200,
       "then a new name is refused, a known one is accepted (null: not finite)");
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_scalar{job_id=\"sc\",name=\"s5\"}") == 5 &&
           strstr(m, "bmt_scalar{job_id=\"sc\",name=\"s29\"} NaN"),
       "s5 from rank 1 alone: 5; s29 with rank 0's non-finite value: NaN");
    free(m);
    collector_destroy(c);
}

/* A restart that resumes from an earlier checkpoint measures val_loss at the
 * old run's steps again: the page's history takes the new run's values (the
 * step history does so too), never a mean of the two runs' nor the old run's
 * later points after the new run's. */
static void check_val_history_restart(void)
{
    collector_t *c = make("sc", 1, 2, false);
    char why[300] = "", x[128];
    int bad = 0;
    for (int step = 800; step <= 1000; step += 100)
        for (int r = 0; r < 2; r++) {
            snprintf(x, sizeof(x), "{\"name\":\"val_loss\",\"value\":3,\"step\":%d}", step);
            bad += push_scalars(c, r, x, why) != 200;
        }
    collector_job_restarted(c, 1, "rank 0 (pid 1 on h) exited with code 1");
    g_restart = 1; /* the new run's processes say so */
    for (int r = 0; r < 2; r++)
        bad += push_scalars(c, r, "{\"name\":\"val_loss\",\"value\":1,\"step\":900}", why) != 200;
    size_t len;
    char *s = collector_status_json(c, false, &len);
    ok(bad == 0 && s &&
           strstr(s, "\"val_history\":[{\"step\":800,\"val_loss\":3.0},{\"step\":900,"
                     "\"val_loss\":1.0}]"),
       "after a restart resumed at step 900, val_history is 800: 3 (old run), 900: 1 (new run), "
       "not 900: 2 and 1000: 3 (%s)",
       s ? strstr(s, "\"val_history\"") : "no status");
    free(s);
    collector_destroy(c);
}

static void check_bearer_case(void)
{
    collector_t *c = make("job7", 1, 1, false);
    /* Whitespace after the value is no part of it (RFC 9110 5.5), and
     * libmicrohttpd leaves it there: the right token was refused with 401. */
    const char *auths[] = { "bearer " TOKEN,     "BEARER " TOKEN,      "bEaReR   " TOKEN,
                            "Bearer " TOKEN " ", "Bearer " TOKEN "\t", "Bearer " TOKEN " \t " };
    const char *body = DOC0("job7") "}";
    char why[300] = "";
    for (size_t i = 0; i < sizeof(auths) / sizeof(auths[0]); i++)
        ok(collector_ingest(c, auths[i], body, strlen(body), why, sizeof(why)) == 200,
           "Authorization: \"%s\" accepted (%s)", auths[i], why);
    /* but the token itself is compared whole */
    const char *bad[] = { "Bearer " TOKEN " x", "Bearer " TOKEN "\n", "Bearer \t" TOKEN };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ok(collector_ingest(c, bad[i], body, strlen(body), why, sizeof(why)) == 401,
           "Authorization: \"%s\" refused (401)", bad[i]);
    collector_destroy(c);
}

static void check_conn_limits(void)
{
    static const struct {
        int world;
        long nofile;
        unsigned total, per_ip;
    } t[] = {
        { 2, 1024, 1024 - 138, (1024 - 138) / 2 },
        { 2, 20000, 16384, 8192 }, /* at most 16384 */
        { 1000, 20000, 20000 - 5128, (20000 - 5128) / 2 },
        { 1000, 9000, 9000 - 5128, 2064 }, /* twice one node's 1000 ranks + 64 > half */
        { 2000, 6000, 64, 64 },            /* no room: 64 */
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        unsigned total, per_ip;
        collector_conn_limits(t[i].world, t[i].nofile, &total, &per_ip);
        ok(total == t[i].total && per_ip == t[i].per_ip,
           "%d ranks, %ld files: %u connections (want %u), %u per address (want %u)", t[i].world,
           t[i].nofile, total, t[i].total, per_ip, t[i].per_ip);
    }
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

/* A push of rank r from the process {restart, 1000.5 + start, id}: its steps
 * from..to (one step each, tokens_total 100 per step of the process), and
 * extra members (",\"scalars\":[...]") when not NULL. */
static int push_from(collector_t *c, const char *job, int r, long restart, double start,
                     unsigned id, long from, long to, const char *extra, char *why)
{
    char body[8192];
    why[0] = '\0';
    int n = snprintf(body, sizeof(body),
                     "{\"version\":2,\"job\":\"%s\",\"rank\":%d,\"run\":{\"restart\":%ld,"
                     "\"start\":%.6f,\"id\":\"%016x\"},\"host\":\"h%d\",\"steps\":[",
                     job, r, restart, 1000.5 + start, id, r);
    for (long k = from; k <= to && n < (int)sizeof(body) - 400; k++)
        n += snprintf(body + n, sizeof(body) - (size_t)n,
                      "%s{\"step\":%ld,\"time\":1,\"step_time_s\":0.5,\"tokens\":100,"
                      "\"tokens_total\":%ld,\"tokens_per_s\":200,\"loss\":2}",
                      k > from ? "," : "", k, 100 * (k - from + 1));
    snprintf(body + n, sizeof(body) - (size_t)n, "]%s}", extra ? extra : "");
    return collector_ingest(c, AUTH, body, strlen(body), why, 400);
}

/* The main defect: after a restart of the job, a late push of the old run
 * that names a far step came first and set the window of steps, and every push
 * of the new run was refused (400) for good. Now the run says which it is: the
 * old run's pushes get 409, are counted, and change nothing. */
static void check_restart_late_push(void)
{
    collector_t *c = make("rs", 1, 2, false);
    char why[400] = "";
    size_t len;
    int bad = 0;
    for (int r = 0; r < 2; r++)
        bad += push_from(c, "rs", r, 0, 0, 0xa0 + (unsigned)r, 49996, 50000, NULL, why) != 200;
    ok(bad == 0, "run 0: steps 49996-50000 of 2 ranks (%s)", why);
    collector_job_restarted(c, 1, "rank 1 (pid 7 on h) exited with code 1");
    char *m0 = collector_metrics_text(c, &len);
    /* The stray: rank 1's old process, a step past the old run's last. */
    int code = push_from(c, "rs", 1, 0, 0, 0xa1, 50001, 50001, NULL, why);
    ok(code == 409 && strstr(why, "run: this push comes from run 0 of the job (BMT_RESTART=0), "
                                  "and bmlaunch has restarted the job since: the collector "
                                  "follows run 1"),
       "run 1's first push is the old run's late step 50001: 409 (%d %s)", code, why);
    char *m1 = collector_metrics_text(c, &len);
    ok(sample(m1, "bmt_collector_pushes_total{job_id=\"rs\",code=\"409\"}") == 1 &&
           sample(m1, "bmt_push_old_run_items_total{job_id=\"rs\"}") == 1 &&
           sample(m1, "bmt_push_dropped_total{job_id=\"rs\"}") == 1,
       "counted: a 409, its step in bmt_push_old_run_items_total and bmt_push_dropped_total");
    ok(sample(m0, "bmt_tokens_total{job_id=\"rs\"}") ==
               sample(m1, "bmt_tokens_total{job_id=\"rs\"}") &&
           sample(m1, "bmt_step{job_id=\"rs\"}") == 0 &&
           sample(m1, "bmt_steps_total{job_id=\"rs\"}") ==
               sample(m0, "bmt_steps_total{job_id=\"rs\"}"),
       "and it changed no figure (tokens %g, step %g)",
       sample(m1, "bmt_tokens_total{job_id=\"rs\"}"), sample(m1, "bmt_step{job_id=\"rs\"}"));
    free(m0);
    free(m1);
    /* The new run from step 1 (no checkpoint), each rank a new process. */
    bad = 0;
    for (long st = 1; st <= 3; st++)
        for (int r = 0; r < 2; r++)
            bad += push_from(c, "rs", r, 1, 60, 0xb0 + (unsigned)r, st, st, NULL, why) != 200;
    ok(bad == 0, "then every push of run 1, from step 1, is accepted (%s)", why);
    code = push_from(c, "rs", 0, 0, 0, 0xa0, 50001, 50001, NULL, why);
    ok(code == 409, "a later stray of run 0 is refused too (%d)", code);
    m1 = collector_metrics_text(c, &len);
    ok(sample(m1, "bmt_step{job_id=\"rs\"}") == 3 &&
           sample(m1, "bmt_ranks_reporting{job_id=\"rs\"}") == 2 &&
           sample(m1, "bmt_push_old_run_items_total{job_id=\"rs\"}") == 2 &&
           sample(m1, "bmt_tokens_total{job_id=\"rs\"}") == 2 * 500 + 2 * 100,
       "run 1 shows: step 3, 2 ranks reporting, 2 old-run items, tokens of both runs once "
       "(%g)",
       sample(m1, "bmt_tokens_total{job_id=\"rs\"}"));
    free(m1);
    char *s = collector_status_json(c, true, &len);
    ok(s && strstr(s, "\"old_run_items\":2") && strstr(s, "\"restart\":1,") &&
           strstr(s, "\"run\":{\"restart\":1,\"start\":1060.5,\"id\":\"00000000000000b1\"}"),
       "status: the run restart, the old-run items, each rank's run");
    free(s);
    collector_destroy(c);

    /* A stray that comes before the restart is known: it is this run's, as far
     * as the collector can tell, and nothing more (a far step gets 400). */
    c = make("rs", 1, 1, false);
    ok(push_from(c, "rs", 0, 0, 0, 0xa0, 1, 2, NULL, why) == 200 &&
           push_from(c, "rs", 0, 2, 0, 0xa0, 1, 1, NULL, why) == 400 &&
           strstr(why, "\"restart\" 2 is a run bmlaunch has not started"),
       "a run bmlaunch has not started: 400 (%s)", why);
    collector_destroy(c);
}

/* A rank whose process starts again within the run (a wrapper that runs the
 * program again; no restart by bmlaunch): the newer process replaces the
 * rank's state, the older one's late pushes get 409, and neither locks the
 * other out of the window of steps. */
static void check_rank_renewed(void)
{
    collector_t *c = make("rr", 1, 1, false);
    char why[400] = "";
    size_t len;
    ok(push_from(c, "rr", 0, 0, 0, 0xa0, 49000, 49000, NULL, why) == 200 &&
           push_from(c, "rr", 0, 0, 0, 0xa0, 50000, 50000, NULL, why) == 200,
       "process A: steps 49000, 50000");
    int code = push_from(c, "rr", 0, 0, 5, 0xb0, 1, 2, NULL, why);
    ok(code == 200, "process B (5 s later) from step 1: accepted, its own window (%d %s)", code,
       why);
    char *m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_step{job_id=\"rr\"}") == 2 &&
           sample(m, "bmt_tokens_total{job_id=\"rr\"}") == 100 + 200 &&
           sample(m, "bmt_events_total{job_id=\"rr\",kind=\"restart\"}") == 1,
       "B's step 2 shows; tokens of A (100) and B (200); a restart event (%g %g)",
       sample(m, "bmt_step{job_id=\"rr\"}"), sample(m, "bmt_tokens_total{job_id=\"rr\"}"));
    free(m);
    code = push_from(c, "rr", 0, 0, 0, 0xa0, 50001, 50001, NULL, why);
    ok(code == 409 && strstr(why, "run: rank 0's process 00000000000000a0 (started at "
                                  "1000.500000) is older than the one the collector follows for "
                                  "the rank (00000000000000b0, started at 1005.500000)"),
       "A's late push: 409 (%s)", why);
    code = push_from(c, "rr", 0, 0, 5, 0x10, 3, 3, NULL, why);
    ok(code == 409, "a process started at B's time with a lower id is older too (%d)", code);
    ok(push_from(c, "rr", 0, 0, 5, 0xb0, 3, 3, NULL, why) == 200, "B goes on (%s)", why);
    char *s = collector_status_json(c, false, &len);
    ok(s && strstr(s, "\"detail\":\"collector: rank 0 (on h0) has a newer process (run "
                      "00000000000000b0, started 5.000 s after run 00000000000000a0)"),
       "the restart event names the rank and both processes");
    free(s);
    collector_destroy(c);

    /* Two ranks: rank 1 stops pushing (its process is gone too), and rank 0's
     * new process starts from step 1: once rank 1 has been silent for the
     * stale window it no longer holds the window of steps. */
    static bmt_layout_t l;
    bmt_error_t err;
    bmt_layout_make(&l, 1, 2, 0, 0, &err);
    collector_opts_t o = { .job_id = "rr", .layout = &l, .token = TOKEN, .stale_s = 0.3 };
    c = collector_create(&o, &err);
    ok(push_from(c, "rr", 0, 0, 0, 0xa0, 50000, 50000, NULL, why) == 200 &&
           push_from(c, "rr", 1, 0, 0, 0xa1, 50000, 50000, NULL, why) == 200,
       "ranks 0 and 1 at step 50000");
    code = push_from(c, "rr", 0, 0, 5, 0xb0, 1, 1, NULL, why);
    ok(code == 400 && strstr(why, "step 1 is far from the job's (its highest step so far is 50000"),
       "rank 0's new process at step 1 while rank 1 reports 50000: 400 (%s)", why);
    struct timespec ts = { 0, 400 * 1000000L };
    nanosleep(&ts, NULL);
    code = push_from(c, "rr", 0, 0, 5, 0xb0, 1, 1, NULL, why);
    ok(code == 200, "0.4 s later rank 1 is stale and holds no window: accepted (%d %s)", code, why);
    ok(push_from(c, "rr", 1, 0, 5, 0xb1, 2, 2, NULL, why) == 200,
       "and rank 1's new process near it too (%s)", why);
    collector_destroy(c);
}

/* A late, older scalar value never replaces a newer one of the same process;
 * a newer process's value replaces whatever the older one said. */
static void check_scalar_newest(void)
{
    collector_t *c = make("sn", 1, 1, false);
    char why[400] = "";
    size_t len;
    int bad = 0;
    bad += push_from(c, "sn", 0, 0, 0, 0xa0, 1, 1,
                     ",\"scalars\":[{\"name\":\"val_loss\",\"value\":2,\"step\":20},"
                     "{\"name\":\"bleu\",\"value\":30,\"step\":20}]",
                     why) != 200;
    bad += push_from(c, "sn", 0, 0, 0, 0xa0, 2, 2,
                     ",\"scalars\":[{\"name\":\"val_loss\",\"value\":3,\"step\":10},"
                     "{\"name\":\"bleu\",\"value\":10,\"step\":10}]",
                     why) != 200;
    char *m = collector_metrics_text(c, &len);
    ok(bad == 0 && sample(m, "bmt_val_loss{job_id=\"sn\"}") == 2 &&
           sample(m, "bmt_val_loss_step{job_id=\"sn\"}") == 20 &&
           sample(m, "bmt_scalar{job_id=\"sn\",name=\"bleu\"}") == 30,
       "step 20's values stay after step 10's came late (val_loss %g at %g, bleu %g)",
       sample(m, "bmt_val_loss{job_id=\"sn\"}"), sample(m, "bmt_val_loss_step{job_id=\"sn\"}"),
       sample(m, "bmt_scalar{job_id=\"sn\",name=\"bleu\"}"));
    free(m);
    char *s = collector_status_json(c, false, &len);
    ok(s && strstr(s, "\"val_history\":[{\"step\":20,\"val_loss\":2.0}]"),
       "and the late value is not in the history (%s)", s ? strstr(s, "\"val_history\"") : "");
    free(s);
    bad = push_from(c, "sn", 0, 0, 0, 0xa0, 3, 3,
                    ",\"scalars\":[{\"name\":\"bleu\",\"value\":31,\"step\":20}]", why) != 200;
    bad += push_from(c, "sn", 0, 0, 9, 0xb0, 1, 1,
                     ",\"scalars\":[{\"name\":\"bleu\",\"value\":5,\"step\":1}]", why) != 200;
    m = collector_metrics_text(c, &len);
    ok(bad == 0 && sample(m, "bmt_scalar{job_id=\"sn\",name=\"bleu\"}") == 5 &&
           sample(m, "bmt_scalar_step{job_id=\"sn\",name=\"bleu\"}") == 1,
       "a value of the same step replaces; a newer process's step 1 replaces step 20's (%g)",
       sample(m, "bmt_scalar{job_id=\"sn\",name=\"bleu\"}"));
    free(m);
    collector_destroy(c);
}

/* A process that replaces a rank's (no restart of the job) and measures
 * val_loss at a step its rank already gave replaces the rank's value in that
 * point of the page's history; it used to add a second value, so the point
 * averaged three values of two ranks. */
static void check_val_replaced(void)
{
    collector_t *c = make("vr", 1, 2, false);
    char why[400] = "";
    size_t len;
    int bad = 0;
    bad += push_from(c, "vr", 0, 0, 0, 0xa0, 1, 20,
                     ",\"scalars\":[{\"name\":\"val_loss\",\"value\":2,\"step\":20}]", why) != 200;
    bad += push_from(c, "vr", 1, 0, 0, 0xa1, 1, 20,
                     ",\"scalars\":[{\"name\":\"val_loss\",\"value\":4,\"step\":20}]", why) != 200;
    char *s = collector_status_json(c, false, &len);
    ok(bad == 0 && s && strstr(s, "\"val_history\":[{\"step\":20,\"val_loss\":3.0}]"),
       "two ranks' val_loss at step 20: the point is their mean, 3 (%s)",
       s ? strstr(s, "\"val_history\"") : why);
    free(s);
    bad = push_from(c, "vr", 0, 0, 5, 0xb0, 15, 20,
                    ",\"scalars\":[{\"name\":\"val_loss\",\"value\":10,\"step\":20}]", why) != 200;
    s = collector_status_json(c, false, &len);
    char *m = collector_metrics_text(c, &len);
    ok(bad == 0 && s && strstr(s, "\"val_history\":[{\"step\":20,\"val_loss\":7.0}]") &&
           sample(m, "bmt_val_loss{job_id=\"vr\"}") == 7,
       "rank 0's new process gives step 20 again (10): the point is (10 + 4) / 2, as the gauge "
       "(%s, gauge %g)",
       s ? strstr(s, "\"val_history\"") : why, sample(m, "bmt_val_loss{job_id=\"vr\"}"));
    free(s);
    free(m);
    bad = push_from(c, "vr", 1, 0, 0, 0xa1, 21, 30,
                    ",\"scalars\":[{\"name\":\"val_loss\",\"value\":1,\"step\":30}]", why) != 200;
    bad += push_from(c, "vr", 0, 0, 5, 0xb0, 21, 30,
                     ",\"scalars\":[{\"name\":\"val_loss\",\"value\":3,\"step\":30}]", why) != 200;
    s = collector_status_json(c, false, &len);
    ok(bad == 0 && s &&
           strstr(s, "\"val_history\":[{\"step\":20,\"val_loss\":7.0},{\"step\":30,"
                     "\"val_loss\":2.0}]"),
       "the next point counts each rank once (%s)", s ? strstr(s, "\"val_history\"") : why);
    free(s);
    collector_destroy(c);
}

/* The event status keeps its 32 bits whole; bmt_push_dropped_total never
 * wraps; bmt_step_duration_seconds is NaN, not 0, when no rank reports; a
 * process's host does not change. */
static void check_ranges(void)
{
    collector_t *c = make("rg", 1, 4, false);
    char why[400] = "";
    size_t len;
    const char *ev = ",\"events\":[{\"kind\":\"abort\",\"status\":-2147483648,\"detail\":\"x\"}]";
    int code = push_from(c, "rg", 0, 0, 0, 0xa0, 1, 1, ev, why);
    char *s = collector_status_json(c, false, &len);
    ok(code == 200 && s && strstr(s, "\"status\":-2147483648") &&
           strstr(s, "\"failed_ranks\":[{\"rank\":0,\"host\":\"h0\",\"exit_code\":-2147483648,"),
       "status INT32_MIN is kept whole (%d %s)", code, why);
    free(s);
    code = push_from(c, "rg", 0, 0, 0, 0xa0, 2, 2, NULL, why);
    ok(code == 200, "the same process (host h0) again (%s)", why);
    char body[512];
    snprintf(body, sizeof(body),
             "{\"version\":2,\"job\":\"rg\",\"rank\":0,\"run\":{\"restart\":0,\"start\":1000.5,"
             "\"id\":\"00000000000000a0\"},\"host\":\"elsewhere\"}");
    code = collector_ingest(c, AUTH, body, strlen(body), why, sizeof(why));
    ok(code == 400 && strstr(why, "\"host\" \"elsewhere\" is not the host rank 0's process "
                                  "00000000000000a0 pushed from so far (\"h0\")"),
       "the same process from another host: 400 (%s)", why);

    /* Each process of each rank says it dropped 2^53 items: over 1024 of
     * them the total passes 2^63; it stops there instead of wrapping. */
    double last = 0;
    bool mono = true;
    int bad = 0;
    for (int k = 1; k <= 300; k++)
        for (int r = 0; r < 4; r++) {
            snprintf(body, sizeof(body),
                     "{\"version\":2,\"job\":\"rg\",\"rank\":%d,\"run\":{\"restart\":0,"
                     "\"start\":%d,\"id\":\"00000000000000a0\"},\"dropped\":9007199254740992}",
                     r, 2000 + k);
            bad += collector_ingest(c, AUTH, body, strlen(body), why, sizeof(why)) != 200;
            if (k % 50 == 0 || k == 300) {
                char *m = collector_metrics_text(c, &len);
                double d = sample(m, "bmt_push_dropped_total{job_id=\"rg\"}");
                mono = mono && d >= last;
                last = d;
                free(m);
            }
        }
    ok(bad == 0 && mono && last == 9223372036854775807.0,
       "1200 processes' 2^53 dropped items: the counter never went down and stops at 2^63-1 "
       "(%.17g)",
       last);
    s = collector_status_json(c, false, &len);
    ok(s && strstr(s, "\"dropped\":9223372036854775807"), "status: the same, not negative");
    free(s);
    collector_destroy(c);

    static bmt_layout_t l;
    bmt_error_t err;
    bmt_layout_make(&l, 2, 1, 0, 0, &err);
    collector_opts_t o = { .job_id = "nan", .layout = &l, .token = TOKEN, .stale_s = 0.2 };
    c = collector_create(&o, &err);
    char *m = collector_metrics_text(c, &len);
    ok(strstr(m, "\nbmt_step_duration_seconds{job_id=\"nan\"} NaN\n") &&
           strstr(m, "\nbmt_group_step_duration_seconds{job_id=\"nan\",group=\"1\"} NaN\n"),
       "no rank reported: bmt_step_duration_seconds is NaN, not 0");
    free(m);
    push_from(c, "nan", 0, 0, 0, 0xa0, 1, 1, NULL, why);
    m = collector_metrics_text(c, &len);
    ok(sample(m, "bmt_step_duration_seconds{job_id=\"nan\"}") == 0.5 &&
           strstr(m, "\nbmt_group_step_duration_seconds{job_id=\"nan\",group=\"1\"} NaN\n"),
       "rank 0 reports 0.5 s; group 1, whose rank does not, NaN");
    free(m);
    struct timespec ts = { 0, 300 * 1000000L };
    nanosleep(&ts, NULL);
    m = collector_metrics_text(c, &len);
    ok(strstr(m, "\nbmt_step_duration_seconds{job_id=\"nan\"} NaN\n") &&
           sample(m, "bmt_ranks_reporting{job_id=\"nan\"}") == 0,
       "once rank 0 is stale, NaN again");
    free(m);
    s = collector_status_json(c, false, &len);
    ok(s && strstr(s, "\"step_time_seconds\":null"), "status: null");
    free(s);
    collector_destroy(c);
}

int main(void)
{
    check_refusals();
    check_aggregates();
    check_per_rank_and_labels();
    check_far_steps();
    check_failures();
    check_stale();
    check_counters();
    check_scalars();
    check_val_history_restart();
    check_bearer_case();
    check_conn_limits();
    check_token();
    check_restart_late_push();
    check_rank_renewed();
    check_val_replaced();
    check_scalar_newest();
    check_ranges();
    return done_testing();
}
