/* launcher/cli.h — bmlaunch's command line.
 *
 * Parsing is pure: it fills launch_opts_t or an error message and never exits,
 * so the table of bad inputs is tested directly (tests/unit/test_cli.c) as well
 * as through the binary.
 */
#ifndef BMT_LAUNCHER_CLI_H
#define BMT_LAUNCHER_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "bmt/error.h"
#include "costmodel.h"

typedef struct launch_opts {
    int groups;          /* --groups, default 1 */
    int gpus_per_group;  /* --gpus-per-group, default 1 */
    int gpus_per_node;   /* --gpus-per-node, 0: derived (all ranks on one node locally) */
    int nodes;           /* --nodes, 0: derived */
    const char *device;  /* --device cpu|cuda, else BMT_DEVICE, else cpu */
    const char *backend; /* --backend shm|nccl|none, NULL: by device */
    bool plan;           /* --plan: print the layout and exit */
    bool json;           /* --json: the plan as JSON */
    double grace_s;      /* --grace: SIGTERM -> SIGKILL delay */
    double timeout_s;    /* --timeout: BMT_TIMEOUT for the ranks, 0: leave as is */
    const char *log_dir; /* --log-dir */
    bool tee;            /* --tee: console output too when --log-dir is set */
    bool label;          /* prefix output lines with the rank (--no-label turns off) */
    int verbose;         /* -v */
    bool local;          /* --local: this machine even inside a Slurm allocation */
    bool sbatch;         /* --sbatch: print a batch script for the job */
    bool submit;         /* --submit: hand it to sbatch */
    const char *time;    /* --time (sbatch), default 01:00:00 */
    const char *partition, *account, *job_name, *output, *template_path;
    int signal_lead;          /* --signal-lead: seconds of USR1 warning before the limit */
    costmodel_opts_t cost;    /* --model and the cost model's options (with --plan) */
    bool comm_opts;           /* a cost-model option other than --model was given */
    int metrics_port;         /* --metrics-port, default COLLECTOR_DEFAULT_PORT; 0: off */
    bool metrics_port_set;    /* given: a taken port is an error, not a fallback */
    const char *metrics_bind; /* --metrics-bind, default 127.0.0.1 */
    bool metrics_bind_set;
    bool metrics_per_rank;       /* --metrics-per-rank */
    double metrics_linger_s;     /* --metrics-linger: keep serving after the job */
    const char *metrics_sd_file; /* --metrics-sd-file: Prometheus file_sd target file */
    double metrics_stale_s;      /* --metrics-stale: 0: collector_stale_default */
    int metrics_tls;             /* --metrics-tls auto|on|off: a tls_mode_t (tlscert.h) */
    const char *metrics_cert;    /* --metrics-cert: serve this certificate (PEM) */
    const char *metrics_key;     /* --metrics-key: its private key (PEM) */
    int max_restarts;            /* --max-restarts: restarts after a rank failed, default 0 */
    int prog_argc;               /* the program and its arguments */
    char **prog_argv;
} launch_opts_t;

/* Parse argv. Returns 0 to run, 1 when help or version was printed to stdout
 * (exit 0), -1 on bad usage (err says what is wrong; exit 2). */
int cli_parse(int argc, char **argv, launch_opts_t *o, bmt_error_t *err);

/* --time's default, the batch template's time limit. */
#define CLI_DEFAULT_TIME "01:00:00"

/* The largest --signal-lead: sbatch --signal takes 0 to 65535 seconds. */
#define CLI_MAX_SIGNAL_LEAD 65535

/* How much earlier than --signal-lead Slurm may send it (sbatch(1) --signal:
 * "up to 60 seconds earlier than specified"): the lead and this must be less
 * than the time limit, or USR1 may come at the job's start. */
#define CLI_SIGNAL_EARLY 60

/* The seconds of a time limit sbatch --time takes (as cli_slurm_time_ok), 0 for
 * no limit (UNLIMITED, INFINITE, or 0), or -1 when t is not one. Pure. */
long cli_slurm_time_seconds(const char *t);

/* Is t a time limit sbatch --time takes: MINUTES, MINUTES:SECONDS,
 * HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES,
 * DAYS-HOURS:MINUTES:SECONDS, UNLIMITED or INFINITE? Pure. */
bool cli_slurm_time_ok(const char *t);

/* The usage text. */
void cli_usage(FILE *out);

/* The table of BMT_ environment variables (--help-env). */
void cli_env_help(FILE *out);

#endif
