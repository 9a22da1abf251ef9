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
    double stale_s;     /* a rank that has not pushed a step for this long stops counting
                         * as reporting and is named stale (0: collector_stale_default) */
    bool verbose;       /* say the connection limits on stderr */
    /* What the launcher sees of rank r's process, e.g. "S (sleeping)", into
     * buf; -1 when it cannot see it (Slurm mode). Called with the collector's
     * lock held. NULL: none. */
    int (*proc_state)(void *arg, int rank, char *buf, size_t len);
    void *proc_state_arg;
    /* HTTPS: the certificate (chain) and private key in PEM (copied); NULL:
     * plain HTTP. tlscert.h makes or loads them. */
    const char *tls_cert_pem, *tls_key_pem;
} collector_opts_t;

/* Can this libmicrohttpd serve HTTPS (built with GnuTLS)? */
bool collector_tls_supported(void);

/* The default stale window: COLLECTOR_STALE_STEPS times the slowest step time
 * any rank reported last, at least COLLECTOR_STALE_MIN_S. Pure. */
#define COLLECTOR_STALE_STEPS 5.0
#define COLLECTOR_STALE_MIN_S 10.0
double collector_stale_default(double slowest_step_s);

/* A rank is reporting while its process runs and it pushed a step of this run
 * within the stale window (pushes of scalars or events alone do not count).
 * Stale ranks are named on /metrics (bmt_rank_stale_seconds, the first
 * COLLECTOR_STALE_SHOWN) and in /api/status (stale_ranks): a rank whose process
 * has not exited and that is not reporting, once the window has passed since its
 * last step (one that never pushed a step: since the run's first push). */
#define COLLECTOR_STALE_SHOWN 16

/* The state only (no socket). NULL with err on failure. */
collector_t *collector_create(const collector_opts_t *o, bmt_error_t *err);

/* Serve HTTP (HTTPS with the options' certificate) on bind:port (numeric
 * IPv4 or IPv6 address; port 0: any free one). fallback: when port is taken, take any free port
 * instead (said on stderr). Errors: address not numeric, port taken (without fallback), TLS asked
 * of a libmicrohttpd without it or refused by it.
 *
 * Connections: at most collector_conn_limits' total (what RLIMIT_NOFILE leaves
 * after the launcher's own descriptors) and per client address (half of that,
 * and never fewer than twice the ranks plus 64: every rank of a node pushes
 * from one address); idle ones are closed after COLLECTOR_IDLE_TIMEOUT_S. */
#define COLLECTOR_IDLE_TIMEOUT_S 15u
int collector_listen(collector_t *c, const char *bind, int port, bool fallback, bmt_error_t *err);

/* The limits collector_listen uses for a world of world ranks when
 * nofile descriptors may be open (pure; the total is at least 64). */
void collector_conn_limits(int world, long nofile, unsigned *total, unsigned *per_ip);

/* The port listened on (after collector_listen). */
int collector_port(const collector_t *c);
const char *collector_token(const collector_t *c);

/* One push: the Authorization header's value (or NULL; the scheme "Bearer"
 * in any case) and the body. Returns the HTTP status (200, 400, 401, 409) and,
 * when not 200, the reason in why. A push is checked whole before anything is
 * applied: besides its shape, every step's values must be possible (no null
 * where a figure is always known, no negative count, time or rate; any finite
 * value is possible) and its step near the job's: at most COLLECTOR_STEP_SLACK
 * steps from the highest step of the ranks reporting now (each of their
 * processes' highest; none reporting: any step), plus as many as the leading
 * process makes at twice its step rate in the time since that step (ahead) or
 * since the rank last pushed a step (behind), so pushes that were held back
 * catch up.
 *
 * The run (protocol version 2: "run": {restart, start, id}, made once per
 * process by the push client) says which process of the rank, of which of
 * bmlaunch's runs (BMT_RESTART), pushed. The collector follows one process per
 * rank: the first of the run, until a newer one (later start; same start:
 * greater id) replaces it, which starts the rank's figures and counters of a
 * process afresh (the counters keep what the old one counted) and is a
 * "restart" event of the rank. A push of an earlier run of the job, or of an
 * older process of the rank, is refused with 409 and changes nothing; its
 * items count in bmt_push_old_run_items_total and bmt_push_dropped_total. A
 * run bmlaunch has not started, and a push without a run (version 1), get 400.
 * So a late push of an old run never sets the window of steps, and neither an
 * old process nor a silent one locks a newer one out of it. */
#define COLLECTOR_STEP_SLACK 1000
int collector_ingest(collector_t *c, const char *authorization, const char *body, size_t len,
                     char *why, size_t wlen);

/* Count an answer to a push given before ingest (404, 405, 413, or
 * libmicrohttpd's own) in the push counters. A push refused with 400 whose job
 * and rank are known also counts its items in that rank's dropped ones. */
void collector_count(collector_t *c, int code);

/* The supervisor's view: rank r's process exited with wait_status (a waitpid
 * status: a non-zero code or a signal counts the rank as failed, and the first
 * COLLECTOR_FAILED_SHOWN failed ranks of a run are named on /metrics and are
 * each a "rank_failed" event with rank, host and cause), unless ended_by is
 * not 0: bmlaunch ended it with that signal (after another rank's failure,
 * its grace, or a signal it forwarded), which is no failure of this rank; and
 * the job ended with bmlaunch's exit status. NULL c: no-op. */
#define COLLECTOR_FAILED_SHOWN 16
void collector_rank_exited(collector_t *c, int rank, int wait_status, int ended_by);

/* The host rank r runs on as bmlaunch knows it (under Slurm the node srun
 * named in its report of the task's end), for a rank that has not pushed its
 * own: its failure is then named on that host, not bmlaunch's. NULL host or c:
 * no-op. */
void collector_rank_host(collector_t *c, int rank, const char *host);

/* Rank r called PMIx_Abort (bmt_abort) with status and msg (NULL: none): it
 * failed the job, so it is named as failed now, with status as its exit code
 * and a rank_failed event saying so, before the ranks bmlaunch then ends with
 * SIGTERM; its own exit later is not counted again. The collector also learns
 * it from the rank's "abort" event. Once per rank and run. NULL c: no-op. */
void collector_rank_aborted(collector_t *c, int rank, int status, const char *msg);
void collector_job_ended(collector_t *c, int exit_status);

/* The default --metrics-linger (bmlaunch passes a negative linger): how long to
 * keep serving after the job ended so that a scraper sees the end. 0 when
 * /metrics was not scraped twice during the job (no scraper to wait for);
 * else 1.5 times the longest gap between the recent scrapes plus 1 s, at most
 * COLLECTOR_LINGER_MAX_S (Prometheus's default scrape_interval is 1 m). */
#define COLLECTOR_LINGER_MAX_S 75.0
double collector_linger_auto(collector_t *c);

/* True once /metrics has been answered after collector_job_ended. */
bool collector_scraped_after_end(collector_t *c);

/* bmlaunch started every rank again (restart, 1-based: the new run's
 * BMT_RESTART) after the failure that detail describes ("rank 2 (pid 7 on vm)
 * exited with code 1"): count a "restart" event (rank -1 on /api/status:
 * bmlaunch's own) and every rank as alive again; a new run begins (its failed
 * ranks, steps and stale window), while the counters keep the totals of the
 * runs before. From now on pushes of the earlier runs get 409 (a restart that
 * is not above the last one counts as the next). NULL c: no-op. */
void collector_job_restarted(collector_t *c, int restart, const char *detail);

/* Renderings (malloc'd NUL-terminated text, NULL when out of memory).
 * status: ranks true adds every rank's latest figures. */
char *collector_metrics_text(collector_t *c, size_t *len);
char *collector_status_json(collector_t *c, bool ranks, size_t *len);

/* Stop serving and free everything. NULL: no-op. */
void collector_destroy(collector_t *c);

#endif
