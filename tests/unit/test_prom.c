/* tests/unit/test_prom.c — the pure pieces the monitor plugins and the collector share.
 *
 * plugins/common/prom.c: label escaping, value spelling, metric names, family
 * and sample lines (promtool checks whole outputs in test_monitor.sh).
 * plugins/common/metrics_json.c: metrics and events to JSON and back, with
 * NaN as null, and the refusals of malformed fields (an event's status beyond
 * 32 bits among them); the run identity a push names (made, both ways, its
 * order, its refusals).
 * runtime/monitor.c: the GPU peak table, the arithmetic of one step, and the
 * rule for scalar names (and a scalar's JSON both ways).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/monitor.h"
#include "common/metrics_json.h"
#include "common/prom.h"
#include "monitor.h"
#include "tap.h"

static void check_escape(void)
{
    static const struct {
        const char *in, *out;
    } t[] = {
        { "plain", "plain" },          { "a\"b", "a\\\"b" }, { "back\\slash", "back\\\\slash" },
        { "new\nline", "new\\nline" }, { "", "" },           { "\"\\\n", "\\\"\\\\\\n" },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char out[64];
        prom_escape_label(t[i].in, out, sizeof(out));
        is_str(out, t[i].out, "label value escaped");
    }
    char small[3];
    prom_escape_label("a\"bc", small, sizeof(small));
    is_str(small, "a", "an escape that does not fit is left out whole, not cut in half");
}

static void check_values(void)
{
    static const struct {
        double v;
        const char *s;
    } t[] = {
        { 0, "0" },
        { 42, "42" },
        { -3, "-3" },
        { 1e15, "1000000000000000" },
        { 0.5, "0.5" },
        { 1e300, "1.0000000000000001e+300" },
        { 9007199254740993.0, "9007199254740992" },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char out[64];
        prom_value(t[i].v, out, sizeof(out));
        is_str(out, t[i].s, "value spelled");
    }
    char out[64];
    prom_value(NAN, out, sizeof(out));
    is_str(out, "NaN", "NaN");
    prom_value(INFINITY, out, sizeof(out));
    is_str(out, "+Inf", "+Inf");
    prom_value(-INFINITY, out, sizeof(out));
    is_str(out, "-Inf", "-Inf");
    prom_value(0.1, out, sizeof(out));
    ok(strtod(out, NULL) == 0.1, "0.1 round-trips (%s)", out);
}

static void check_names(void)
{
    const char *good[] = { "bmt_tokens_total", "a", "_x", "a:b", "A9" };
    const char *bad[] = { "", "9a", "a-b", "a b", "é", NULL };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        ok(prom_valid_name(good[i]), "valid metric name '%s'", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ok(!prom_valid_name(bad[i]), "invalid metric name '%s'", bad[i] ? bad[i] : "(null)");
}

static void check_lines(void)
{
    prom_buf_t b = { 0 };
    prom_family(&b, "bmt_x_total", "counter", "help with \\ and\nnewline");
    const char *l[] = { "job", "j\"1", "group", "0", NULL };
    prom_sample(&b, "bmt_x_total", l, 3);
    prom_sample(&b, "bmt_x_total", NULL, 0.25);
    is_str(b.data,
           "# HELP bmt_x_total help with \\\\ and\\nnewline\n"
           "# TYPE bmt_x_total counter\n"
           "bmt_x_total{job=\"j\\\"1\",group=\"0\"} 3\n"
           "bmt_x_total 0.25\n",
           "family, labelled and bare samples");
    ok(!b.oom, "no allocation failed");
    prom_buf_free(&b);
    ok(b.data == NULL && b.len == 0, "buffer freed and reset");
}

static const char *kinds[] = { "param", "gathered",   "grad_full", "grad",
                               "optim", "activation", "workspace" };

static bmt_step_metrics_t sample_metrics(void)
{
    bmt_step_metrics_t m;
    memset(&m, 0, sizeof(m));
    m.size = sizeof(m);
    m.version = BMT_PLUGIN_ABI_VERSION;
    m.step = 12;
    m.time = 1796000000.25;
    m.step_time_s = 0.5;
    m.tokens = 4096;
    m.samples = 4;
    m.tokens_total = 49152;
    m.samples_total = 48;
    m.loss = 3.25;
    m.tokens_per_s = 8192;
    m.samples_per_s = 8;
    m.flops = 1e12;
    m.flops_per_s = 2e12;
    m.mfu = NAN;
    m.comm_wait_s = 0.125;
    m.plugin_s = 1e-5;
    m.grad_norm = INFINITY;
    m.lr = 3e-4;
    m.skipped = 1;
    m.microbatches = 2;
    m.skipped_total = 3;
    m.params = 124000000;
    m.mem_kinds = 7;
    for (int k = 0; k < 7; k++) {
        m.mem_current[k] = 1000u * (unsigned)(k + 1);
        m.mem_peak[k] = 5000000000ull + (unsigned)k;
    }
    m.mem_peak_all = 6000000000ull;
    return m;
}

static void check_json(void)
{
    bmt_step_metrics_t m = sample_metrics(), back;
    json_t *o = metrics_step_json(&m, kinds, 7);
    ok(o != NULL, "metrics to JSON");
    ok(json_is_null(json_object_get(o, "mfu")) && json_is_null(json_object_get(o, "grad_norm")),
       "NaN and infinity become null (JSON has neither)");
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    json_error_t je;
    json_t *again = json_loads(text, 0, &je);
    free(text);
    char why[200] = "";
    int rc = metrics_step_parse(again, &back, kinds, 7, why, sizeof(why));
    json_decref(again);
    ok(rc == 0, "parsed back (%s)", why);
    ok(back.step == m.step && back.tokens == m.tokens && back.tokens_total == m.tokens_total &&
           back.samples == m.samples && back.params == m.params && back.skipped == 1 &&
           back.microbatches == 2 && back.skipped_total == 3,
       "integers round-trip");
    ok(back.time == m.time && back.step_time_s == m.step_time_s && back.loss == m.loss &&
           back.tokens_per_s == m.tokens_per_s && back.flops_per_s == m.flops_per_s &&
           back.comm_wait_s == m.comm_wait_s && back.lr == m.lr && back.plugin_s == m.plugin_s,
       "reals round-trip exactly");
    ok(isnan(back.mfu) && isnan(back.grad_norm), "null comes back as NaN");
    ok(memcmp(back.mem_current, m.mem_current, sizeof(m.mem_current)) == 0 &&
           memcmp(back.mem_peak, m.mem_peak, sizeof(m.mem_peak)) == 0 && back.mem_kinds == 7,
       "memory per kind round-trips (beyond 32 bits too)");
    ok(back.mem_peak_all == m.mem_peak_all,
       "mem_peak_all round-trips (the jsonl and push lines left it out)");
    {
        /* an older libbmt's step (size 432) or one without memory: no mem_peak_all */
        bmt_step_metrics_t old = sample_metrics(), none = sample_metrics();
        old.size = offsetof(bmt_step_metrics_t, mem_peak_all);
        none.mem_kinds = 0;
        json_t *oo = metrics_step_json(&old, kinds, 7), *on = metrics_step_json(&none, kinds, 7),
               *om = metrics_step_json(&m, kinds, 7);
        ok(om && json_integer_value(json_object_get(om, "mem_peak_all")) == 6000000000ll && oo &&
               json_object_get(oo, "mem_peak_all") == NULL && on &&
               json_object_get(on, "mem_peak_all") == NULL,
           "mem_peak_all is written when libbmt filled it and memory was measured, else left out");
        json_decref(oo), json_decref(on), json_decref(om);
    }

    static const struct {
        const char *doc, *why;
    } badin[] = {
        { "[]", "a step must be a JSON object" },
        { "{\"step\": \"12\"}", "field \"step\" must be an integer" },
        { "{\"step\": 1.5}", "field \"step\" must be an integer" },
        { "{\"loss\": \"low\"}", "field \"loss\" must be a number or null" },
        { "{\"skipped\": 4294967296}", "field \"skipped\" must be a 32-bit integer" },
        { "{\"memory\": 3}", "field \"memory\" must be an object" },
        { "{\"mem_peak_all\": -1}", "field \"mem_peak_all\" must be a count of bytes" },
        { "{\"memory\": {\"param\": {\"current\": -1, \"peak\": 0}}}",
          "memory \"param\" must be {\"current\": bytes, \"peak\": bytes}" },
    };
    for (size_t i = 0; i < sizeof(badin) / sizeof(badin[0]); i++) {
        json_t *d = json_loads(badin[i].doc, 0, &je);
        why[0] = '\0';
        rc = metrics_step_parse(d, &back, kinds, 7, why, sizeof(why));
        ok(rc == -1 && strcmp(why, badin[i].why) == 0, "refused %s: \"%s\"", badin[i].doc, why);
        json_decref(d);
    }
    json_t *d =
        json_loads("{\"step\": 3, \"unknown\": [1], \"memory\": {\"new_kind\": 1}}", 0, &je);
    rc = metrics_step_parse(d, &back, kinds, 7, why, sizeof(why));
    json_decref(d);
    ok(rc == 0 && back.step == 3 && isnan(back.loss) && back.tokens == 0,
       "unknown fields and kinds are ignored, missing ones are 0 or NaN");

    metrics_event_t ev = { .kind = BMT_EVENT_CHECKPOINT_SAVED, .step = 7, .time = 5.5 }, eb;
    snprintf(ev.name, sizeof(ev.name), "checkpoint_saved");
    snprintf(ev.detail, sizeof(ev.detail), "ckpt/step-7 \"quoted\"");
    json_t *e = metrics_event_json(&ev);
    rc = metrics_event_parse(e, &eb, why, sizeof(why));
    json_decref(e);
    ok(rc == 0 && eb.kind == ev.kind && eb.step == 7 && eb.time == 5.5 &&
           strcmp(eb.detail, ev.detail) == 0 && strcmp(eb.name, "checkpoint_saved") == 0,
       "an event round-trips");
    d = json_loads("{\"kind\": \"reboot\"}", 0, &je);
    rc = metrics_event_parse(d, &eb, why, sizeof(why));
    json_decref(d);
    ok(rc == -1 && strstr(why, "unknown event kind \"reboot\""), "unknown event kind: %s", why);
}

static void check_peaks(void)
{
    static const struct {
        const char *name;
        double tflops;
    } t[] = {
        { "NVIDIA H200", 989 },
        { "NVIDIA H100 80GB HBM3", 989 },
        { "NVIDIA H100 PCIe", 756 },
        { "NVIDIA H100 NVL", 835 },
        { "NVIDIA H200 NVL", 835 },
        { "NVIDIA GH200 480GB", 989 },
        { "NVIDIA H20", 148 },
        { "NVIDIA A100-SXM4-80GB", 312 },
        { "NVIDIA A10", 125 },
        { "NVIDIA L40S", 362 },
        { "NVIDIA L4", 121 },
        { "NVIDIA B200", 2250 },
        { "NVIDIA GeForce RTX 4090", 0 },
        { "Tesla V100-SXM2-16GB", 0 },
        { "", 0 },
        { "H2000", 0 },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        ok(bmt_peak_flops_of(t[i].name) == t[i].tflops * 1e12, "peak of '%s' is %g TFLOP/s (%g)",
           t[i].name, t[i].tflops, bmt_peak_flops_of(t[i].name) / 1e12);
    ok(bmt_peak_flops_of(NULL) == 0, "peak of NULL is 0");
}

static void check_fill(void)
{
    bmt_step_info_t info = { .step = 9,
                             .lr = 1e-3,
                             .grad_norm = 2.5,
                             .skipped = false,
                             .skipped_total = 1,
                             .microbatches = 4 };
    bmt_step_report_t r = BMT_STEP_REPORT_INITIALIZER;
    ok(isnan(r.loss) && r.tokens == 0 && r.optim == NULL, "the report initializer: no loss");
    r.tokens = 8192;
    r.samples = 8;
    r.loss = 2.0;
    r.flops = 6.0 * 124e6 * 8192;
    r.params = 124000000;
    r.optim = &info;
    bmt_step_metrics_t m;
    memset(&m, 0, sizeof(m));
    monitor_fill(&m, &r, 17, 0.25, 0.05, 989e12);
    ok(m.step == 9, "step from the optimizer, not the report count");
    ok(m.tokens_per_s == 8192 / 0.25 && m.samples_per_s == 32, "rates: counts / step time");
    ok(m.flops_per_s == r.flops / 0.25 && fabs(m.mfu - r.flops / 0.25 / 989e12) < 1e-15,
       "FLOP/s and MFU against the peak (%g)", m.mfu);
    ok(m.comm_wait_s == 0.05 && m.grad_norm == 2.5 && m.lr == 1e-3 && m.skipped_total == 1 &&
           m.microbatches == 4 && m.params == 124000000 && m.loss == 2.0,
       "the rest copied");
    r.optim = NULL;
    r.flops = 0;
    r.loss = NAN;
    monitor_fill(&m, &r, 17, 0.25, 0, 989e12);
    ok(m.step == 17 && isnan(m.grad_norm) && isnan(m.lr) && m.microbatches == 0,
       "without an optimizer step: the report count, NaN norm and lr");
    ok(isnan(m.flops_per_s) && isnan(m.mfu) && isnan(m.loss), "no FLOPs given: no FLOP/s, no MFU");
    r.flops = 1e9;
    monitor_fill(&m, &r, 17, 0.25, 0, 0);
    ok(m.flops_per_s == 4e9 && isnan(m.mfu), "no peak known: FLOP/s but no MFU");
}

static void check_scalars(void)
{
    static const struct {
        const char *name;
        bool ok;
    } t[] = {
        { "val_loss", true },
        { "a", true },
        { "bleu4_x", true },
        { "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", true },   /* 48 */
        { "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false }, /* 49 */
        { "", false },
        { "Val", false },
        { "9x", false },
        { "_x", false },
        { "a-b", false },
        { "a b", false },
        { "a\"b", false },
        { "x.y", false },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        ok(bmt_scalar_name_ok(t[i].name) == t[i].ok, "scalar name '%s': %s", t[i].name,
           t[i].ok ? "valid" : "refused");
    ok(!bmt_scalar_name_ok(NULL), "scalar name NULL: refused");
    bmt_error_t err;
    ok(bmt_report_scalar(NULL, "x", 1, &err) < 0 && strstr(err.text, "NULL"),
       "bmt_report_scalar(NULL, ...) fails: %s", err.text);

    metrics_scalar_t in = { .step = 7, .time = 1.5, .value = NAN }, out;
    snprintf(in.name, sizeof(in.name), "val_loss");
    json_t *o = metrics_scalar_json(&in);
    char *text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS), why[200] = "";
    ok(text && strcmp(text, "{\"name\":\"val_loss\",\"step\":7,\"time\":1.5,\"value\":null}") == 0,
       "a scalar as JSON, NaN as null: %s", text);
    ok(metrics_scalar_parse(o, &out, why, sizeof(why)) == 0 && out.step == 7 && out.time == 1.5 &&
           isnan(out.value) && strcmp(out.name, "val_loss") == 0,
       "and back (%s)", why);
    free(text);
    json_decref(o);
}

/* An event's status is an int32_t: its whole range goes through, and a value
 * beyond it is refused rather than cut to 32 bits. */
static void check_event_status(void)
{
    static const struct {
        const char *json;
        int rc;
        int32_t status;
    } t[] = {
        { "{\"kind\":\"abort\",\"status\":2147483647}", 0, INT32_MAX },
        { "{\"kind\":\"abort\",\"status\":-2147483648}", 0, INT32_MIN },
        { "{\"kind\":\"abort\",\"status\":2147483648}", -1, 0 },
        { "{\"kind\":\"abort\",\"status\":4294967297}", -1, 0 }, /* was read as 1 */
        { "{\"kind\":\"abort\",\"status\":-2147483649}", -1, 0 },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        json_error_t je;
        json_t *o = json_loads(t[i].json, 0, &je);
        metrics_event_t ev;
        char why[200] = "";
        int rc = metrics_event_parse(o, &ev, why, sizeof(why));
        json_decref(o);
        ok(rc == t[i].rc &&
               (rc < 0 ? strstr(why, "event field \"status\" must be a 32-bit integer") != NULL
                       : ev.status == t[i].status),
           "%s: %d %s", t[i].json, rc, why);
    }
}

/* The run a push names: made with 64 random bits, the same both ways, ordered
 * by restart, start, id; malformed ones refused. */
static void check_run(void)
{
    metrics_run_t a, b, back;
    char why[200] = "";
    double t0 = metrics_unix_s();
    ok(metrics_run_make(&a, 3, why, sizeof(why)) == 0 &&
           metrics_run_make(&b, 3, why, sizeof(why)) == 0,
       "two runs made (%s)", why);
    ok(a.restart == 3 && a.start >= t0 && a.start <= metrics_unix_s() &&
           strlen(a.id) == METRICS_RUN_ID_LEN &&
           strspn(a.id, "0123456789abcdef") == METRICS_RUN_ID_LEN && strcmp(a.id, b.id) != 0,
       "restart 3, start now, 16 hex digits, two processes apart (%s %s)", a.id, b.id);
    json_t *o = metrics_run_json(&a);
    ok(o && metrics_run_parse(o, &back, why, sizeof(why)) == 0 && metrics_run_cmp(&a, &back) == 0 &&
           back.start == a.start,
       "and back through JSON exactly (%s)", why);
    json_decref(o);
    static const struct {
        metrics_run_t a, b;
        int sign;
    } order[] = {
        { { 0, 5.0, "ffffffffffffffff" }, { 1, 1.0, "0000000000000000" }, -1 }, /* restart first */
        { { 1, 1.0, "ffffffffffffffff" }, { 1, 2.0, "0000000000000000" }, -1 }, /* then start */
        { { 1, 2.0, "00000000000000a1" }, { 1, 2.0, "00000000000000a0" }, 1 },  /* then id */
        { { 1, 2.0, "00000000000000a0" }, { 1, 2.0, "00000000000000a0" }, 0 },
    };
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        int c = metrics_run_cmp(&order[i].a, &order[i].b);
        ok((c > 0) - (c < 0) == order[i].sign, "run order %zu: %d", i, c);
    }
    static const struct {
        const char *json, *why;
    } bad[] = {
        { "7", "\"run\" must be an object" },
        { "{\"start\":1,\"id\":\"0123456789abcdef\"}", "\"restart\" must be a count" },
        { "{\"restart\":1.5,\"start\":1,\"id\":\"0123456789abcdef\"}",
          "\"restart\" must be a count" },
        { "{\"restart\":0,\"start\":-1,\"id\":\"0123456789abcdef\"}",
          "\"start\" must be a positive" },
        { "{\"restart\":0,\"start\":\"1\",\"id\":\"0123456789abcdef\"}",
          "\"start\" must be a positive" },
        { "{\"restart\":0,\"start\":1,\"id\":\"0123456789abcde\"}",
          "\"id\" must be 16 lower-case" },
        { "{\"restart\":0,\"start\":1,\"id\":\"0123456789abcdefa\"}",
          "\"id\" must be 16 lower-case" },
        { "{\"restart\":0,\"start\":1,\"id\":\"0123456789abcdeg\"}",
          "\"id\" must be 16 lower-case" },
        { "{\"restart\":0,\"start\":1,\"id\":7}", "\"id\" must be 16 lower-case" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_error_t je;
        o = json_loads(bad[i].json, JSON_DECODE_ANY, &je);
        why[0] = '\0';
        int rc = metrics_run_parse(o, &back, why, sizeof(why));
        json_decref(o);
        ok(rc == -1 && strstr(why, bad[i].why), "run %s refused: %s", bad[i].json, why);
    }
}

int main(void)
{
    check_escape();
    check_values();
    check_names();
    check_lines();
    check_json();
    check_peaks();
    check_fill();
    check_scalars();
    check_event_status();
    check_run();
    return done_testing();
}
