/* bmt/plugin.h — the monitor plugin ABI, version 1.
 *
 * A monitor plugin is a shared object that exports one symbol,
 *
 *     BMT_PLUGIN_EXPORT const bmt_monitor_plugin_v1_t bmt_monitor_plugin_v1 = {
 *         sizeof(bmt_monitor_plugin_v1_t), BMT_PLUGIN_ABI_VERSION, "name",
 *         my_init, my_on_step, my_on_event, my_finalize, my_on_scalar,
 *     };
 *
 * libbmt loads the plugins named in BMT_PLUGINS (a comma-separated list of
 * names, looked up as BMT_PLUGIN_DIR/<name>.so, or paths containing '/'; blanks
 * around an entry and empty entries are ignored) with dlopen in bmt_init,
 * checks size and version, refuses a plugin loaded twice (the same file, or
 * the same name in the struct, named twice: each would get every step), and
 * calls:
 *
 *   init       once, in bmt_init, with the job's facts. Returns 0, or -1 with a
 *              message in err (the load then fails as BMT_PLUGIN_ERRORS says).
 *   on_step    once per bmt_report_step, with the step's metrics, on the
 *              training thread. It must not block: a plugin that does I/O or
 *              network hands the metrics to a thread of its own through a
 *              bounded queue (the push and jsonl plugins drop the oldest item
 *              when full). libbmt measures the time spent in plugin callbacks
 *              and reports it as plugin_s in the next step.
 *   on_event   for a checkpoint saved, a restart, an abort, a note (may be NULL).
 *   on_scalar  for each bmt_report_scalar (validation loss, a program's own
 *              figures; may be NULL). Appended to the struct, which was 48
 *              bytes before (BMT_PLUGIN_V1_MIN_SIZE): a plugin built against
 *              that header still loads and is never called for scalars.
 *   finalize   once, in bmt_finalize or bmt_abort: flush what is queued within
 *              job->flush_timeout_s, stop the plugin's threads, free its state.
 *
 * Pointers handed to a callback are valid during the call only; copy what you
 * keep. Callbacks are never called concurrently for one plugin. Structs grow at
 * the end only; each starts with its size, so a plugin built against an older
 * header reads the fields it knows. A new, incompatible ABI gets a new version
 * number and a new symbol name (bmt_monitor_plugin_v2).
 *
 * The plugins that ship with bmt are in plugins/ (push, jsonl); docs/metrics.md
 * describes every field.
 */
#ifndef BMT_PLUGIN_H
#define BMT_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BMT_PLUGIN_ABI_VERSION 1u
#define BMT_PLUGIN_SYMBOL "bmt_monitor_plugin_v1"
/* Memory kinds a metrics struct can carry (bmt/device.h uses the first 7). */
#define BMT_METRICS_MEM_KINDS 16

#if defined(__GNUC__)
#define BMT_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define BMT_PLUGIN_EXPORT
#endif

/* The job and this rank, fixed for the life of the process. */
typedef struct bmt_job_info bmt_job_info_t;
struct bmt_job_info {
    uint32_t size;           /* sizeof(bmt_job_info_t) of the libbmt that fills it */
    uint32_t version;        /* BMT_PLUGIN_ABI_VERSION */
    const char *job_id;      /* BMT_JOB_ID (set by bmlaunch), else the PMIx namespace */
    const char *hostname;    /* short host name of this rank */
    const char *device;      /* "cpu" or "cuda" */
    const char *device_name; /* "NVIDIA H200", or the CPU model */
    const char *backend;     /* "shm", "nccl" or "none" */
    int32_t rank, world;
    int32_t groups, gpus_per_group, gpus_per_node, nodes;
    int32_t group, group_rank, node, local_rank;
    int32_t device_index; /* CUDA ordinal, -1 on cpu */
    int32_t mem_kinds;    /* entries of mem_kind_names and of the metrics' mem arrays */
    const char *const *mem_kind_names; /* "param", "gathered", ... (bmt/device.h) */
    double peak_flops;                 /* this rank's peak dense bf16 FLOP/s (BMT_PEAK_TFLOPS or the
                                        * detected GPU); 0 when unknown (then mfu is NaN) */
    double start_time;                 /* unix seconds at bmt_init */
    double flush_timeout_s; /* finalize must return within this (BMT_PLUGIN_FLUSH_TIMEOUT) */
    const char *libbmt_version;
    /* The value of a BMT_ environment knob, or its documented default (NULL when
     * unset and without default, or not a knob): plugins read their settings
     * through this so that defaults live in one table (docs/env.md). */
    const char *(*knob)(const char *name);
    /* Appended (size > 144): a plugin calls fail(job, msg), from any of its
     * threads, when it has lost for good what it was handed (jsonl: its file
     * can no longer be written); job is the pointer init got, which stays
     * valid until finalize returns. The first message is kept. Unless
     * BMT_PLUGIN_ERRORS=warn, every later bmt_report_step, bmt_report_event
     * and bmt_report_scalar of the rank then fails with it, so the program
     * stops non-zero instead of ending well with its metrics half-written.
     * The plugin says the details on stderr itself. */
    void (*fail)(const bmt_job_info_t *job, const char *msg);
};

/* One optimizer step of this rank. Counts are this rank's; NaN marks a figure
 * that is unknown (no loss given, no peak known, no optimizer step). */
typedef struct bmt_step_metrics {
    uint32_t size;         /* sizeof(bmt_step_metrics_t) of the libbmt that fills it */
    uint32_t version;      /* BMT_PLUGIN_ABI_VERSION */
    int64_t step;          /* optimizer steps taken (bmt_step_info_t.step), else reports so far */
    double time;           /* unix seconds at the end of the step */
    double step_time_s;    /* wall time of the step (since the previous report or bmt_step_begin) */
    int64_t tokens;        /* tokens this rank processed in the step */
    int64_t samples;       /* samples (sequences) this rank processed in the step */
    int64_t tokens_total;  /* since bmt_init */
    int64_t samples_total; /* since bmt_init */
    double loss;           /* this rank's loss (NaN: not given) */
    double tokens_per_s;   /* tokens / step_time_s */
    double samples_per_s;  /* samples / step_time_s */
    double flops;          /* model FLOPs this rank did in the step (0: not given) */
    double flops_per_s;    /* flops / step_time_s: achieved model FLOP/s */
    double mfu;            /* flops_per_s / peak_flops (NaN when the peak is unknown) */
    double comm_wait_s;    /* time the step waited on communication (docs/metrics.md) */
    double plugin_s;       /* time spent in plugin callbacks during the previous step */
    double grad_norm;      /* global gradient norm before clipping (NaN: no optimizer step) */
    double lr;             /* learning rate used (NaN: no optimizer step) */
    int32_t skipped;       /* 1: the optimizer skipped this step (inf/nan gradients) */
    int32_t microbatches;  /* micro-batches in the step (0: not known) */
    int64_t skipped_total; /* skipped steps so far */
    int64_t params;        /* parameters of the whole model (0: not given) */
    int32_t mem_kinds;     /* entries used in the arrays below */
    int32_t reserved;
    uint64_t mem_current[BMT_METRICS_MEM_KINDS]; /* bytes now, per kind (bmt/device.h) */
    uint64_t mem_peak[BMT_METRICS_MEM_KINDS];    /* most bytes during the step, per kind */
    /* Appended (size > 432): most bytes of all kinds at once during the step.
     * Stream-ordered memory (activations, gradient shards) peaks at other times
     * in each kind, so this is at most the sum of mem_peak, and is what compares
     * with torch.cuda.max_memory_allocated. */
    uint64_t mem_peak_all;
} bmt_step_metrics_t;

typedef enum bmt_event_kind {
    BMT_EVENT_CHECKPOINT_SAVED = 1, /* detail: the checkpoint's path */
    BMT_EVENT_RESTART = 2,          /* the job resumed (from a checkpoint; detail: its path) */
    BMT_EVENT_ABORT = 3,            /* bmt_abort was called; status and detail are its own */
    BMT_EVENT_NOTE = 4,             /* free text from the program */
    BMT_EVENT_KIND_MAX = 4
} bmt_event_kind_t;

typedef struct bmt_event {
    uint32_t size;      /* sizeof(bmt_event_t) */
    uint32_t version;   /* BMT_PLUGIN_ABI_VERSION */
    int32_t kind;       /* bmt_event_kind_t */
    int32_t status;     /* BMT_EVENT_ABORT: the abort status; else 0 */
    int64_t step;       /* the last reported step */
    double time;        /* unix seconds */
    const char *name;   /* "checkpoint_saved", "restart", "abort", "note" */
    const char *detail; /* never NULL; may be "" */
} bmt_event_t;

/* A named figure of this rank (bmt_report_scalar in bmt/monitor.h): "val_loss"
 * for the validation loss, or a name of the program's own. The value may be
 * NaN or infinite (a diverged validation loss is a figure too). */
typedef struct bmt_scalar {
    uint32_t size;    /* sizeof(bmt_scalar_t) */
    uint32_t version; /* BMT_PLUGIN_ABI_VERSION */
    int64_t step;     /* the last reported step (0 before the first) */
    double time;      /* unix seconds */
    const char *name; /* [a-z][a-z0-9_]*, at most BMT_SCALAR_NAME_MAX bytes */
    double value;
} bmt_scalar_t;

/* A scalar's name is at most this many bytes; a process reports at most
 * BMT_SCALARS_MAX distinct names (bounded cardinality: each name is one
 * Prometheus series per job). */
#define BMT_SCALAR_NAME_MAX 48
#define BMT_SCALARS_MAX 32

typedef struct bmt_monitor_plugin_v1 {
    uint32_t size;    /* sizeof(bmt_monitor_plugin_v1_t) */
    uint32_t version; /* BMT_PLUGIN_ABI_VERSION */
    const char *name; /* short name, used in messages */
    int (*init)(const bmt_job_info_t *job, void **state, char *err, size_t errlen);
    void (*on_step)(void *state, const bmt_step_metrics_t *metrics);
    void (*on_event)(void *state, const bmt_event_t *event); /* may be NULL */
    void (*finalize)(void *state);
    /* Appended (size > 48): called for each bmt_report_scalar; may be NULL. */
    void (*on_scalar)(void *state, const bmt_scalar_t *scalar);
} bmt_monitor_plugin_v1_t;

/* The smallest bmt_monitor_plugin_v1_t libbmt loads: the struct as it was
 * before on_scalar was appended. */
#define BMT_PLUGIN_V1_MIN_SIZE 48u

/* The ABI is these layouts on LP64 (x86-64, aarch64): a change that moves a
 * field is a new version. */
#if defined(__LP64__) && !defined(__cplusplus)
_Static_assert(offsetof(bmt_job_info_t, rank) == 48, "bmt_job_info_t layout");
_Static_assert(offsetof(bmt_job_info_t, mem_kind_names) == 96, "bmt_job_info_t layout");
_Static_assert(offsetof(bmt_job_info_t, fail) == 144, "bmt_job_info_t layout");
_Static_assert(sizeof(bmt_job_info_t) == 152, "bmt_job_info_t layout");
_Static_assert(offsetof(bmt_step_metrics_t, loss) == 64, "bmt_step_metrics_t layout");
_Static_assert(offsetof(bmt_step_metrics_t, mem_current) == 176, "bmt_step_metrics_t layout");
_Static_assert(offsetof(bmt_step_metrics_t, mem_peak_all) == 432, "bmt_step_metrics_t layout");
_Static_assert(sizeof(bmt_step_metrics_t) == 440, "bmt_step_metrics_t layout");
_Static_assert(sizeof(bmt_event_t) == 48, "bmt_event_t layout");
_Static_assert(sizeof(bmt_scalar_t) == 40, "bmt_scalar_t layout");
_Static_assert(offsetof(bmt_monitor_plugin_v1_t, on_scalar) == BMT_PLUGIN_V1_MIN_SIZE,
               "bmt_monitor_plugin_v1_t layout");
_Static_assert(sizeof(bmt_monitor_plugin_v1_t) == 56, "bmt_monitor_plugin_v1_t layout");
#endif

#ifdef __cplusplus
}
#endif
#endif
