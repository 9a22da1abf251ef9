/* plugins/common/metrics_json.h — step metrics and events as JSON, both ways.
 *
 * One table (METRICS_FIELDS) names every scalar field of bmt_step_metrics_t
 * once; the push and jsonl plugins write it and bmlaunch's collector reads it,
 * so the two sides cannot drift. JSON has no NaN or infinity: such values are
 * written as null and read back as NaN. Memory is an object of kinds:
 * "memory": {"param": {"current": 1024, "peak": 2048}, ...}, and
 * "mem_peak_all" the most of all kinds at once (when memory was measured and
 * the step's libbmt fills that appended field).
 */
#ifndef BMT_PLUGINS_METRICS_JSON_H
#define BMT_PLUGINS_METRICS_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "bmt/plugin.h"

/* X(field, kind): kind I64 (int64_t), I32 (int32_t) or F64 (double). */
#define METRICS_FIELDS(X)                                                                          \
    X(step, I64)                                                                                   \
    X(time, F64)                                                                                   \
    X(step_time_s, F64)                                                                            \
    X(tokens, I64)                                                                                 \
    X(samples, I64)                                                                                \
    X(tokens_total, I64)                                                                           \
    X(samples_total, I64)                                                                          \
    X(loss, F64)                                                                                   \
    X(tokens_per_s, F64)                                                                           \
    X(samples_per_s, F64)                                                                          \
    X(flops, F64)                                                                                  \
    X(flops_per_s, F64)                                                                            \
    X(mfu, F64)                                                                                    \
    X(comm_wait_s, F64)                                                                            \
    X(plugin_s, F64)                                                                               \
    X(grad_norm, F64)                                                                              \
    X(lr, F64)                                                                                     \
    X(skipped, I32)                                                                                \
    X(microbatches, I32)                                                                           \
    X(skipped_total, I64)                                                                          \
    X(params, I64)

/* An event as plugins queue it (bmt_event_t with its strings copied). */
typedef struct metrics_event {
    int32_t kind, status;
    int64_t step;
    double time;
    char name[32];
    char detail[512];
} metrics_event_t;

void metrics_event_copy(metrics_event_t *dst, const bmt_event_t *ev);

/* A scalar as plugins queue it (bmt_scalar_t with its name copied). */
typedef struct metrics_scalar {
    int64_t step;
    double time, value;
    char name[BMT_SCALAR_NAME_MAX + 1];
} metrics_scalar_t;

/* What the push and jsonl plugins queue: a step, an event or a scalar, copied. */
typedef enum {
    METRICS_STEP,
    METRICS_EVENT,
    METRICS_SCALAR
} metrics_item_type_t;
typedef struct metrics_item {
    metrics_item_type_t type;
    union {
        bmt_step_metrics_t step;
        metrics_event_t event;
        metrics_scalar_t scalar;
    } u;
} metrics_item_t;

/* Fill *it from a step (the fields the caller's libbmt filled, by m->size; the
 * rest zero) or from an event. */
void metrics_item_step(metrics_item_t *it, const bmt_step_metrics_t *m);
void metrics_item_event(metrics_item_t *it, const bmt_event_t *ev);
void metrics_item_scalar(metrics_item_t *it, const bmt_scalar_t *sc);

/* The run a push comes from (the push protocol's "run", version 2): which
 * process of a rank, of which of bmlaunch's runs, sent it. The push plugin
 * makes one when it starts (once per process, unless the process starts libbmt
 * again); python/bmt does the same. The collector follows one process per rank
 * and tells a late push of an older one (a previous run of the job, or a
 * process of this rank that a newer one replaced) from the newer one's. */
#define METRICS_PROTOCOL_VERSION 2
#define METRICS_RUN_ID_LEN 16 /* hex digits: 64 random bits */
/* The most "dropped" a push may say: 2^53, exact as a double (Prometheus,
 * JavaScript) and as a JSON integer. A client's count stays there rather than
 * wrap; no process drops that many items (a million a second for 285 years). */
#define METRICS_DROPPED_MAX (UINT64_C(1) << 53)
typedef struct metrics_run {
    int64_t restart; /* BMT_RESTART of the process: bmlaunch's run (0, then 1, 2, ...) */
    double start;    /* unix seconds when the process's push client started */
    char id[METRICS_RUN_ID_LEN + 1]; /* lower-case hex: tells apart processes started at once */
} metrics_run_t;

/* A new run identity for this process: restart (BMT_RESTART), the time now
 * and 64 bits from getrandom. 0, or -1 with why. */
int metrics_run_make(metrics_run_t *run, int64_t restart, char *why, size_t len);

/* {"restart": n, "start": unix seconds, "id": "16 hex digits"} (NULL when out
 * of memory). */
json_t *metrics_run_json(const metrics_run_t *run);

/* Read a "run" object: restart a count, start a positive finite number, id
 * exactly METRICS_RUN_ID_LEN lower-case hex digits. 0, or -1 with why. */
int metrics_run_parse(const json_t *o, metrics_run_t *run, char *why, size_t len);

/* Order of two runs of one rank: by restart, then start, then id (<0, 0, >0:
 * a is older, the same, newer). Pure. */
int metrics_run_cmp(const metrics_run_t *a, const metrics_run_t *b);

/* Monotonic and unix clocks in seconds. */
double metrics_mono_s(void);
double metrics_unix_s(void);

/* New JSON objects (NULL when out of memory). kind_names has kinds entries. */
json_t *metrics_step_json(const bmt_step_metrics_t *m, const char *const *kind_names, int kinds);
json_t *metrics_event_json(const metrics_event_t *ev);
/* {"name": ..., "value": number or null, "step": ..., "time": ...} */
json_t *metrics_scalar_json(const metrics_scalar_t *sc);

/* Read a step object written by metrics_step_json into *m (fields missing are
 * 0, or NaN for reals; unknown fields and memory kinds are ignored; mem_kinds
 * is 0 when "memory" names no known kind: memory not measured). Returns
 * 0, or -1 with why naming the field that has the wrong type. */
int metrics_step_parse(const json_t *o, bmt_step_metrics_t *m, const char *const *kind_names,
                       int kinds, char *why, size_t len);
/* An event's "status" must fit its int32_t (bmt_event_t.status): a value out
 * of that range is refused, never cut to 32 bits. */
int metrics_event_parse(const json_t *o, metrics_event_t *ev, char *why, size_t len);
/* Types and lengths only: whether the name is a valid one is the reader's check
 * (bmt_scalar_name_ok: plugins do not link libbmt). */
int metrics_scalar_parse(const json_t *o, metrics_scalar_t *sc, char *why, size_t len);

/* A double as a JSON number, or null when it is not finite. */
json_t *metrics_real(double v);

/* Copy src into dst (size bytes, NUL-terminated) as valid UTF-8: cut at a
 * character boundary when it does not fit, and each byte that is not part of a
 * well-formed UTF-8 sequence written as '?' (JSON strings must be UTF-8; a
 * detail cut in the middle of a character could not be sent or served).
 * Returns the bytes written, without the NUL. */
size_t metrics_utf8_copy(char *dst, size_t size, const char *src);

#endif
