/* launcher/collector.h — bmlaunch's metrics endpoint (libmicrohttpd).
 *
 * The ranks' push plugin POSTs their step metrics to /api/push with the job's
 * bearer token; the collector keeps each rank's latest figures and a history of
 * whole-job steps, and serves
 *   /metrics     Prometheus text format 0.0.4: per job and per group (per rank
 *                with --metrics-per-rank), so 1000 ranks make a bounded number
 *                of series;
 *   /api/status  JSON: layout, ranks alive and reporting, last step,
 *                throughput, per-group figures, step history, recent events;
 *   /            a self-contained live page (launcher/web/index.html).
 * docs/metrics.md lists every metric. The state half (ingest, render) works
 * without a socket, so unit tests drive it directly; collector_listen adds the
 * HTTP server on its own threads.
 */
#ifndef BMT_LAUNCHER_COLLECTOR_H
#define BMT_LAUNCHER_COLLECTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "bmt/error.h"
#include "bmt/layout.h"

#define COLLECTOR_DEFAULT_PORT 9477
#define COLLECTOR_MAX_BODY (4u << 20) /* bytes of one push */

typedef struct collector collector_t;

typedef struct collector_opts {
    const char *job_id;
    const bmt_layout_t *layout;
    const char *device; /* "cpu" or "cuda" */
    bool per_rank;      /* per-rank series on /metrics */
    const char *token;  /* NULL: a random one (getrandom) */
    double stale_s;     /* a rank that has not pushed for this long stops counting as
                         * reporting (0: 30 s or 5 step times, whichever is longer) */
} collector_opts_t;

/* The state only (no socket). NULL with err on failure. */
collector_t *collector_create(const collector_opts_t *o, bmt_error_t *err);

/* Serve HTTP on bind:port (numeric IPv4 or IPv6 address; port 0: any free
 * one). fallback: when port is taken, take any free port instead (said on
 * stderr). Errors: address not numeric, port taken (without fallback). */
int collector_listen(collector_t *c, const char *bind, int port, bool fallback, bmt_error_t *err);

/* The port listened on (after collector_listen). */
int collector_port(const collector_t *c);
const char *collector_token(const collector_t *c);

/* One push: the Authorization header's value (or NULL) and the body. Returns
 * the HTTP status (200, 400, 401) and, when not 200, the reason in why. */
int collector_ingest(collector_t *c, const char *authorization, const char *body, size_t len,
                     char *why, size_t wlen);

/* Count a request refused before ingest (404, 405, 413) in the push counters. */
void collector_count(collector_t *c, int code);

/* The supervisor's view: rank r's process exited (ranks_alive), the job ended. */
void collector_rank_exited(collector_t *c, int rank);
void collector_job_ended(collector_t *c, int exit_status);

/* bmlaunch started every rank again (restart, 1-based) after the failure that
 * detail describes ("rank 2 (pid 7 on vm) exited with code 1"): count a
 * "restart" event (rank -1 on /api/status: bmlaunch's own) and every rank as
 * alive again. NULL c: no-op. */
void collector_job_restarted(collector_t *c, int restart, const char *detail);

/* Renderings (malloc'd NUL-terminated text, NULL when out of memory).
 * status: ranks true adds every rank's latest figures. */
char *collector_metrics_text(collector_t *c, size_t *len);
char *collector_status_json(collector_t *c, bool ranks, size_t *len);

/* Stop serving and free everything. NULL: no-op. */
void collector_destroy(collector_t *c);

#endif
