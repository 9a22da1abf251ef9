/* runtime/env.c — the table of BMT_ environment knobs and their parsers.
 *
 * Launcher-set knobs (the layout) are how the same rank program runs under
 * bmlaunch and under srun; user knobs tune the runtime. Keep docs/env.md in step
 * with this table (tests/integration/test_docs.sh checks it).
 */
#include "env.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/layout.h"
#include "error.h"

static const env_knob_t knobs[] = {
    { "BMT_GROUPS", NULL, "number of groups (data-parallel replicas); set by bmlaunch" },
    { "BMT_GPUS_PER_GROUP", NULL, "ranks per group (ZeRO-3 shards); set by bmlaunch" },
    { "BMT_GPUS_PER_NODE", NULL, "ranks per node; set by bmlaunch" },
    { "BMT_NODES", NULL, "nodes of the job; set by bmlaunch" },
    { "BMT_WORLD_SIZE", NULL, "groups * gpus_per_group; set by bmlaunch" },
    { "BMT_RANK", NULL, "this process's rank, for programs that do not use PMIx; set by bmlaunch" },
    { "BMT_LOCAL_RANK", NULL, "rank within the node (picks the GPU); set by bmlaunch" },
    { "BMT_GROUP", NULL, "this rank's group; set by bmlaunch" },
    { "BMT_GROUP_RANK", NULL, "this rank's index in its group; set by bmlaunch" },
    { "BMT_NODE", NULL, "this rank's node; set by bmlaunch" },
    { "BMT_JOB_ID", NULL,
      "job identifier: the PMIx namespace of the job's first run; set by bmlaunch" },
    { "BMT_RESTART", NULL,
      "how often bmlaunch --max-restarts restarted the job before this run (0 on the first); set "
      "by bmlaunch" },
    { "BMT_PENDING_SIGNALS", NULL,
      "USR1, USR2 or USR1,USR2: signals that came to bmlaunch before this run of a restarted job; "
      "bmt_init raises them; set by bmlaunch" },
    { "BMT_DEVICE", "cpu", "cpu or cuda: where buffers live and compute runs" },
    { "BMT_TEMPLATE_DIR", NULL,
      "directory of bmt.sbatch for bmlaunch --sbatch, in place of the installed one" },
    { "BMT_BACKEND", NULL, "shm, nccl or none; default shm on cpu, nccl on cuda" },
    { "BMT_TIMEOUT", "300", "seconds any bootstrap step or collective may take before it fails" },
    { "BMT_CHECK_COLLECTIVES", "0",
      "1: every collective first checks that all ranks of its communicator issued the same "
      "call (kind, count, dtype, op, root), and fails naming the first that did not" },
    { "BMT_CHECK_OVERWRITE", "0",
      "1: gradients a block list leaves to callbacks that overwrite them "
      "(bmt_blocklist_set_grad_overwrite) are filled with NaN first, so a callback that adds "
      "to them or misses an element makes NaN (tests)" },
    { "BMT_SHM_CHUNK", "1M",
      "bytes each rank stages per step in the shm backend (K/M/G suffix); "
      "each shm communicator reserves (2*size+2) times this in /dev/shm" },
    { "BMT_PLUGINS", NULL,
      "monitor plugins to load: comma-separated names (BMT_PLUGIN_DIR/<name>.so) or paths; "
      "bmlaunch adds push when its metrics endpoint is on" },
    { "BMT_PLUGIN_DIR", NULL,
      "where plugin names are looked up; set by bmlaunch, else the installed lib/bmt/plugins" },
    { "BMT_FAULT", NULL,
      "tests: step:RANK:STEP or save:RANK:STEP kills that rank after step STEP or while saving "
      "it; nan:RANK:STEP plants a NaN in its parameters after step STEP; first run only" },
    { "BMT_PLUGIN_ERRORS", "fail",
      "fail: a plugin that cannot be loaded fails bmt_init, one that loses data later fails "
      "the rank's next report; warn: say so and run without it" },
    { "BMT_PLUGIN_FLUSH_TIMEOUT", "5",
      "seconds a plugin may take at bmt_finalize to send or write what it has queued" },
    { "BMT_PEAK_TFLOPS", NULL,
      "peak dense TFLOP/s of one rank for MFU; default: from the GPU's name, none on cpu" },
    { "BMT_METRICS_URL", NULL, "push plugin: where to POST metrics; set by bmlaunch" },
    { "BMT_METRICS_TOKEN", NULL, "push plugin: the job's bearer token; set by bmlaunch" },
    { "BMT_METRICS_CA_PEM", NULL,
      "push plugin: the certificate (PEM) an https BMT_METRICS_URL must present; set by bmlaunch" },
    { "BMT_METRICS_QUEUE", "1024",
      "push and jsonl plugins: items queued before the oldest is dropped" },
    { "BMT_METRICS_TIMEOUT", "5", "push plugin: seconds one HTTP request may take" },
    { "BMT_PUSHGATEWAY_URL", NULL,
      "push plugin: also PUT each rank's latest metrics to this Prometheus Pushgateway" },
    { "BMT_JSONL", "bmt-metrics-%j-%r.jsonl",
      "jsonl plugin: output file; %r becomes the rank, %j the job id, %% a percent sign" },
    { NULL, NULL, NULL },
};

const env_knob_t *env_knobs(void) { return knobs; }

static const env_knob_t *find(const char *name)
{
    for (const env_knob_t *k = knobs; k->name; k++)
        if (strcmp(k->name, name) == 0)
            return k;
    return NULL;
}

const char *env_get(const char *name)
{
    const env_knob_t *k = find(name);
    if (k == NULL)
        return NULL;
    const char *v = getenv(name);
    return v ? v : k->deflt;
}

bool env_plain_decimal(const char *v)
{
    size_t whole = strspn(v, "0123456789"), frac = 0;
    if (v[whole] == '.')
        frac = strspn(v + whole + 1, "0123456789");
    return whole + frac > 0 && v[whole + (v[whole] == '.' ? 1 + frac : 0)] == '\0';
}

int env_get_seconds(const char *name, double *out, bmt_error_t *err)
{
    const char *v = env_get(name);
    if (v == NULL)
        return errprintf(err, "%s is not set", name);
    errno = 0;
    char *end = NULL;
    /* strtod alone would also take blanks, a sign, hex and exponents */
    double d = env_plain_decimal(v) ? strtod(v, &end) : 0;
    if (!env_plain_decimal(v) || errno == ERANGE || !isfinite(d) || d <= 0)
        return errprintf(err,
                         "%s='%.900s' is not a positive number of seconds (a plain decimal, such "
                         "as 300 or 2.5)",
                         name, v);
    *out = d;
    return 0;
}

int env_get_positive(const char *name, int *out, bmt_error_t *err)
{
    const char *v = env_get(name);
    if (v == NULL)
        return 0;
    if (bmt_parse_positive(v, name, out, err) < 0)
        return -1;
    return 1;
}

int env_get_flag(const char *name, bool *out, bmt_error_t *err)
{
    const char *v = env_get(name);
    if (v == NULL)
        return errprintf(err, "%s is not set", name);
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return errprintf(err, "%s='%.900s' is not 0 or 1", name, v);
    *out = v[0] == '1';
    return 0;
}

int env_get_bytes(const char *name, size_t *out, bmt_error_t *err)
{
    const char *v = env_get(name);
    if (v == NULL)
        return errprintf(err, "%s is not set", name);
    errno = 0;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    unsigned long long mult = 1;
    if (end != v && *end != '\0') {
        if (strcmp(end, "K") == 0 || strcmp(end, "k") == 0)
            mult = 1ull << 10;
        else if (strcmp(end, "M") == 0 || strcmp(end, "m") == 0)
            mult = 1ull << 20;
        else if (strcmp(end, "G") == 0 || strcmp(end, "g") == 0)
            mult = 1ull << 30;
        else
            mult = 0;
    }
    /* A digit first: strtoull takes blanks and signs, and " -1" wraps to 2^64 - 1. */
    if (v[0] < '0' || v[0] > '9' || mult == 0 || errno == ERANGE || n == 0 ||
        n > (unsigned long long)SIZE_MAX / mult)
        return errprintf(err, "%s='%.900s' is not a byte count (e.g. 4096, 64K, 1M)", name, v);
    *out = (size_t)(n * mult);
    return 0;
}
