/* bmt/monitor.h — per-step metrics and monitor plugins, as a training program sees them.
 *
 * A training loop reports each optimizer step once:
 *
 *     bmt_step_report_t r = BMT_STEP_REPORT_INITIALIZER;
 *     r.tokens = B * T;  r.samples = B;  r.loss = loss;
 *     r.flops = 6.0 * params * B * T;   (model FLOPs of this rank's step)
 *     r.params = params;  r.optim = &info;   (from bmt_optim_step)
 *     bmt_report_step(ctx, &r, &metrics, &err);
 *
 * libbmt computes the figures once (step time, tokens/s, achieved FLOP/s, MFU
 * against the GPU's peak, time waiting on communication, memory per kind) and
 * hands them to the monitor plugins named in BMT_PLUGINS (bmt/plugin.h), which
 * bmt_init loaded. Under bmlaunch the `push` plugin is on by default and sends
 * them to bmlaunch's metrics endpoint (docs/metrics.md).
 *
 * Step time runs from the previous bmt_report_step (or bmt_step_begin, or
 * bmt_init) to this one. bmt_report_step waits for the device (the step's
 * kernels and collectives) so that the time is the step's.
 *
 * Threads: the functions below and bmt_abort run the plugins' callbacks,
 * which bmt/plugin.h promises are never concurrent, and take no lock: call
 * them from one thread at a time (the training thread).
 */
#ifndef BMT_MONITOR_H
#define BMT_MONITOR_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/bmt.h"
#include "bmt/optim.h"
#include "bmt/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bmt_step_report {
    size_t size;
    uint32_t magic;
    uint32_t version;
    int64_t tokens;  /* tokens this rank processed in the step (all micro-batches), >= 0 */
    int64_t samples; /* samples (sequences) this rank processed, >= 0 */
    double loss;     /* this rank's loss; NaN (the default) when there is none */
    double flops;    /* model FLOPs of this rank's step (forward + backward, no
                      * recomputation), >= 0; 0: unknown (no FLOP/s, no MFU) */
    int64_t params;  /* parameters of the whole model, >= 0; 0: unknown */
    const bmt_step_info_t *optim; /* this step's bmt_optim_step result, or NULL */
} bmt_step_report_t;

#define BMT_STEP_REPORT_MAGIC 0x50455453u /* "STEP" */
#define BMT_STEP_REPORT_VERSION 1u
#define BMT_STEP_REPORT_INITIALIZER                                                                \
    {                                                                                              \
        sizeof(bmt_step_report_t), BMT_STEP_REPORT_MAGIC, BMT_STEP_REPORT_VERSION, 0, 0,           \
            __builtin_nan(""), 0.0, 0, NULL                                                        \
    }

/* Start timing a step now (optional): the next report's step time runs from
 * here rather than from the previous report. Use it to leave evaluation or a
 * checkpoint out of a step's time. Local; NULL: no-op. */
BMT_API void bmt_step_begin(bmt_ctx_t *ctx);

/* Finish a step: wait for the device, compute this rank's metrics, hand them to
 * every loaded plugin, and copy them to *out (when not NULL). Local (no
 * collective). Errors: bad report (negative counts, not from
 * BMT_STEP_REPORT_INITIALIZER), the device failed, a plugin lost data for good
 * earlier (job->fail in bmt/plugin.h: a jsonl file that cannot be written;
 * not with BMT_PLUGIN_ERRORS=warn), after bmt_abort. */
BMT_API int bmt_report_step(bmt_ctx_t *ctx, const bmt_step_report_t *report,
                            bmt_step_metrics_t *out, bmt_error_t *err);

/* Tell the plugins about an event (BMT_EVENT_CHECKPOINT_SAVED, _RESTART, _NOTE;
 * bmt_abort sends BMT_EVENT_ABORT itself). detail may be NULL. Local. Errors:
 * another kind, a plugin lost data (as bmt_report_step), after bmt_abort. */
BMT_API int bmt_report_event(bmt_ctx_t *ctx, bmt_event_kind_t kind, const char *detail,
                             bmt_error_t *err);

/* Report a named figure of this rank at the current step: the validation loss
 * as "val_loss" (exported as bmt_val_loss), or a figure of the program's own
 * (exported as bmt_scalar{name="..."}: docs/metrics.md). Every plugin with an
 * on_scalar gets it; under bmlaunch the push plugin sends it to the collector.
 * The name is [a-z][a-z0-9_]*, at most BMT_SCALAR_NAME_MAX bytes; a process
 * reports at most BMT_SCALARS_MAX distinct names over its life, and the first
 * name beyond that is an error (a name per step would be a new Prometheus
 * series per step). The value may be NaN or infinite. Local (no collective).
 * Errors: bad name, too many names, a plugin lost data (as bmt_report_step),
 * after bmt_abort (after bmt_finalize ctx is freed: no call may use it). */
BMT_API int bmt_report_scalar(bmt_ctx_t *ctx, const char *name, double value, bmt_error_t *err);

/* Whether name is a valid scalar name ([a-z][a-z0-9_]*, 1 to BMT_SCALAR_NAME_MAX bytes). */
BMT_API bool bmt_scalar_name_ok(const char *name);

/* The plugins bmt_init loaded, in BMT_PLUGINS order: their count, and plugin i
 * as BMT_PLUGINS named it, a name or a path (NULL when out of range). */
BMT_API int bmt_plugin_count(const bmt_ctx_t *ctx);
BMT_API const char *bmt_plugin_name(const bmt_ctx_t *ctx, int i);

/* This rank's peak dense bf16 FLOP/s as the metrics use it (0: unknown). */
BMT_API double bmt_peak_flops(const bmt_ctx_t *ctx);

/* The peak dense bf16 FLOP/s of a GPU from its name ("NVIDIA H200" -> 989e12),
 * 0 when the name is not in the table (docs/metrics.md lists it). */
BMT_API double bmt_peak_flops_of(const char *device_name);

#ifdef __cplusplus
}
#endif
#endif
