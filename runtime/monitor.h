/* runtime/monitor.h — per-step metrics and monitor plugins (internal side).
 *
 * Public side: bmt/monitor.h (what a training program calls) and bmt/plugin.h
 * (what a plugin implements). init.c calls these.
 */
#ifndef BMT_RUNTIME_MONITOR_H
#define BMT_RUNTIME_MONITOR_H

#include "bmt/monitor.h"

/* Load BMT_PLUGINS and call their init (bmt_init, after layout and device). */
int monitor_init(bmt_ctx_t *ctx, bmt_error_t *err);

/* Finalize the plugins (each flushes within BMT_PLUGIN_FLUSH_TIMEOUT) and
 * free the monitor. -1, said on stderr, when a plugin called job->fail at any
 * time, its finalize included (its metrics are incomplete), unless
 * BMT_PLUGIN_ERRORS=warn; else 0. */
int monitor_finalize(bmt_ctx_t *ctx);

/* bmt_abort: tell the plugins (BMT_EVENT_ABORT), then finalize them. */
void monitor_abort(bmt_ctx_t *ctx, int status, const char *msg);

/* The figures of one step from the report and the measured times (pure).
 * step_time_s > 0; peak_flops 0 when unknown. Fills every field of *m but the
 * memory arrays, time, plugin_s, and the totals, which the caller owns. */
void monitor_fill(bmt_step_metrics_t *m, const bmt_step_report_t *r, int64_t reports,
                  double step_time_s, double comm_wait_s, double peak_flops);

#endif
