/* launcher/cli.c — parse bmlaunch's options.
 *
 * GNU getopt_long in "+" mode: options stop at the first non-option, so the
 * program's own options are never taken for ours; `--` may separate them too.
 * Every number goes through bmt_parse_positive, so "8x", "-1", "0" and "" are
 * all refused with a message naming the option.
 */
#include "cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/bmt.h"
#include "env.h"
#include "collector.h"
#include "costmodel.h"
#include "error.h"
#include "tlscert.h"

#define MAX_RESTARTS 1000 /* --max-restarts: a bound, not a budget anyone needs */

enum {
    OPT_GPN = 256,
    OPT_DEVICE,
    OPT_BACKEND,
    OPT_PLAN,
    OPT_JSON,
    OPT_GRACE,
    OPT_TIMEOUT,
    OPT_LOG_DIR,
    OPT_TEE,
    OPT_NO_LABEL,
    OPT_HELP_ENV,
    OPT_LOCAL,
    OPT_SBATCH,
    OPT_SUBMIT,
    OPT_TIME,
    OPT_PARTITION,
    OPT_ACCOUNT,
    OPT_JOB_NAME,
    OPT_OUTPUT,
    OPT_SIGNAL_LEAD,
    OPT_TEMPLATE,
    OPT_MODEL,
    OPT_BUSBW_GROUP,
    OPT_BUSBW_REPLICA,
    OPT_BUSBW_FLAT,
    OPT_LATENCY_US,
    OPT_ZERO,
    OPT_GRAD_DTYPE,
    OPT_LAYERS,
    OPT_SEQ_LEN,
    OPT_MICRO_BATCH,
    OPT_ACCUM,
    OPT_CKPT,
    OPT_CKPT_BUDGET,
    OPT_KEEP_ATTENTION,
    OPT_FP8,
    OPT_FP8_SPEEDUP,
    OPT_MFU,
    OPT_GPU,
    OPT_GPU_MEM,
    OPT_NVLINK_BUSBW,
    OPT_NIC_BUSBW,
    OPT_CALL_US,
    OPT_METRICS_PORT,
    OPT_METRICS_BIND,
    OPT_METRICS_PER_RANK,
    OPT_METRICS_LINGER,
    OPT_METRICS_SD_FILE,
    OPT_METRICS_STALE,
    OPT_METRICS_TLS,
    OPT_METRICS_CERT,
    OPT_METRICS_KEY,
    OPT_MAX_RESTARTS,
};

static const struct option long_opts[] = {
    { "groups", required_argument, NULL, 'g' },
    { "gpus-per-group", required_argument, NULL, 'n' },
    { "gpus-per-node", required_argument, NULL, OPT_GPN },
    { "nodes", required_argument, NULL, 'N' },
    { "device", required_argument, NULL, OPT_DEVICE },
    { "backend", required_argument, NULL, OPT_BACKEND },
    { "plan", no_argument, NULL, OPT_PLAN },
    { "json", no_argument, NULL, OPT_JSON },
    { "grace", required_argument, NULL, OPT_GRACE },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "log-dir", required_argument, NULL, OPT_LOG_DIR },
    { "tee", no_argument, NULL, OPT_TEE },
    { "no-label", no_argument, NULL, OPT_NO_LABEL },
    { "verbose", no_argument, NULL, 'v' },
    { "help", no_argument, NULL, 'h' },
    { "help-env", no_argument, NULL, OPT_HELP_ENV },
    { "local", no_argument, NULL, OPT_LOCAL },
    { "sbatch", no_argument, NULL, OPT_SBATCH },
    { "submit", no_argument, NULL, OPT_SUBMIT },
    { "time", required_argument, NULL, OPT_TIME },
    { "partition", required_argument, NULL, OPT_PARTITION },
    { "account", required_argument, NULL, OPT_ACCOUNT },
    { "job-name", required_argument, NULL, OPT_JOB_NAME },
    { "output", required_argument, NULL, OPT_OUTPUT },
    { "signal-lead", required_argument, NULL, OPT_SIGNAL_LEAD },
    { "template", required_argument, NULL, OPT_TEMPLATE },
    { "model", required_argument, NULL, OPT_MODEL },
    { "busbw-group", required_argument, NULL, OPT_BUSBW_GROUP },
    { "busbw-replica", required_argument, NULL, OPT_BUSBW_REPLICA },
    { "busbw-flat", required_argument, NULL, OPT_BUSBW_FLAT },
    { "latency-us", required_argument, NULL, OPT_LATENCY_US },
    { "zero", required_argument, NULL, OPT_ZERO },
    { "grad-dtype", required_argument, NULL, OPT_GRAD_DTYPE },
    { "layers", required_argument, NULL, OPT_LAYERS },
    { "seq-len", required_argument, NULL, OPT_SEQ_LEN },
    { "micro-batch", required_argument, NULL, OPT_MICRO_BATCH },
    { "accum", required_argument, NULL, OPT_ACCUM },
    { "ckpt", required_argument, NULL, OPT_CKPT },
    { "ckpt-budget", required_argument, NULL, OPT_CKPT_BUDGET },
    { "keep-attention", required_argument, NULL, OPT_KEEP_ATTENTION },
    { "fp8", required_argument, NULL, OPT_FP8 },
    { "fp8-speedup", required_argument, NULL, OPT_FP8_SPEEDUP },
    { "mfu", required_argument, NULL, OPT_MFU },
    { "gpu", required_argument, NULL, OPT_GPU },
    { "gpu-mem", required_argument, NULL, OPT_GPU_MEM },
    { "nvlink-busbw", required_argument, NULL, OPT_NVLINK_BUSBW },
    { "nic-busbw", required_argument, NULL, OPT_NIC_BUSBW },
    { "call-us", required_argument, NULL, OPT_CALL_US },
    { "metrics-port", required_argument, NULL, OPT_METRICS_PORT },
    { "metrics-bind", required_argument, NULL, OPT_METRICS_BIND },
    { "metrics-per-rank", no_argument, NULL, OPT_METRICS_PER_RANK },
    { "metrics-linger", required_argument, NULL, OPT_METRICS_LINGER },
    { "metrics-sd-file", required_argument, NULL, OPT_METRICS_SD_FILE },
    { "metrics-stale", required_argument, NULL, OPT_METRICS_STALE },
    { "metrics-tls", required_argument, NULL, OPT_METRICS_TLS },
    { "metrics-cert", required_argument, NULL, OPT_METRICS_CERT },
    { "metrics-key", required_argument, NULL, OPT_METRICS_KEY },
    { "max-restarts", required_argument, NULL, OPT_MAX_RESTARTS },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
};

void cli_usage(FILE *out)
{
    fputs("Usage: bmlaunch [OPTIONS] [--] PROGRAM [ARGS...]\n"
          "       bmlaunch [LAYOUT OPTIONS] --plan [--json]\n"
          "\n"
          "Run PROGRAM as groups x gpus-per-group ranks: ZeRO-3 inside each group,\n"
          "data parallel across groups. bmlaunch is the PMIx server of the ranks,\n"
          "supervises them, and ends the job when the first rank fails.\n"
          "\n"
          "Layout:\n"
          "  -g, --groups N          data-parallel groups (default 1)\n"
          "  -n, --gpus-per-group N  ranks per group, sharing one replica (default 1)\n"
          "      --gpus-per-node N   ranks per node (default: all on this node)\n"
          "  -N, --nodes N           nodes of the allocation (default: derived)\n"
          "      --plan              print the layout, alignment and alternatives; run nothing\n"
          "      --json              with --plan: JSON with per-rank detail\n"
          "Cost model (with --plan; docs/planner.md):\n"
          "      --model NAME|COUNT  step time, exposed communication and memory per GPU of\n"
          "                          this layout and the others worth trying, ranked:\n"
          "                          a preset (d12 d24 d36 d48 = GPT-2; llama3.2-1b\n"
          "                          llama3.2-3b llama3-8b llama3-70b llama3-405b)\n"
          "                          or a count (70B, 1.5e9)\n"
          "      --layers N          with a count: its layers (default: from the count)\n"
          "      --seq-len T         tokens per sequence (default: the model's; 4096)\n"
          "      --micro-batch B     sequences per GPU per micro-batch (default 1)\n"
          "      --accum M           micro-batches per step (default 1)\n"
          "      --ckpt 0|1          activation checkpointing per block (default 1)\n"
          "      --ckpt-budget MIB   with --ckpt 1: the last layers whose activations fit in\n"
          "                          MIB are kept, not recomputed (as the trainers choose)\n"
          "      --keep-attention 0|1  with --ckpt 1: every layer keeps its attention's\n"
          "                          output, recomputations skip it (default 1, the trainers')\n"
          "      --fp8 0|1           the trainers' --fp8: the layers' products in FP8, their\n"
          "                          operands kept as 1-byte codes (default 0)\n"
          "      --fp8-speedup X     with --fp8 1: those products' speed over bf16 (1.30, fitted)\n"
          "      --zero 2|3          parameters gathered once or twice a step (default 3)\n"
          "      --grad-dtype bf16|fp16|f32  gradient reduce-scatter dtype (default f32)\n"
          "      --gpu KIND          h200 (default), h100, a100, b200: peak, memory, NVLink\n"
          "      --mfu F             fraction of the bf16 peak compute reaches (0.45)\n"
          "      --gpu-mem GIB       memory per GPU (default: the kind's)\n"
          "      --nvlink-busbw GBPS busbw of a ring on one node (default: fitted)\n"
          "      --nic-busbw GBPS    busbw one GPU's NIC carries across nodes (default 46)\n"
          "      --busbw-group GBPS, --busbw-replica GBPS, --busbw-flat GBPS\n"
          "                          this busbw for that communicator, whatever it crosses\n"
          "      --latency-us US     every ring or tree step costs US (default: NCCL's)\n"
          "      --call-us US        a call's cost beyond NCCL's latency (default: fitted)\n"
          "Ranks:\n"
          "      --device cpu|cuda   where ranks compute (default: BMT_DEVICE, else cpu)\n"
          "      --backend NAME      shm, nccl or none (default: shm on cpu, nccl on cuda)\n"
          "      --timeout SECONDS   deadline of every bootstrap step and collective\n"
          "                          (BMT_TIMEOUT in the ranks; default 300)\n"
          "Slurm:\n"
          "      --local             inside an allocation, run on this machine, not with srun\n"
          "      --sbatch            print a batch script for this job (templates/bmt.sbatch)\n"
          "      --submit            with --sbatch: hand the script to sbatch\n"
          "      --time T            job time limit (default 01:00:00)\n"
          "      --partition P, --account A, --job-name N   passed to #SBATCH lines\n"
          "      --output PATTERN    batch output file (default bmt-%x-%j.out)\n"
          "      --signal-lead S     send USR1 S seconds before the limit (default 120)\n"
          "      --template FILE     the batch template (default: the installed one)\n"
          "Metrics (docs/metrics.md):\n"
          "      --metrics-port N    serve /metrics (Prometheus), /api/status and a live page\n"
          "                          on this port (default 9477, or a free one if taken);\n"
          "                          0 turns the endpoint and the ranks' push plugin off\n"
          "                          (the other metrics options are then refused)\n"
          "      --metrics-bind ADDR address to listen on (default 127.0.0.1; under Slurm\n"
          "                          with several nodes, 0.0.0.0)\n"
          "      --metrics-per-rank  per-rank series on /metrics too (default: job and group)\n"
          "      --metrics-linger S  keep serving S seconds after the job ends (default:\n"
          "                          until one more scrape when something scrapes /metrics,\n"
          "                          at most 75 s; none when nothing does)\n"
          "      --metrics-sd-file F write a Prometheus file_sd target file F for the job\n"
          "                          while it runs (removed at exit)\n"
          "      --metrics-stale S   a running rank that pushes nothing for S seconds is\n"
          "                          named stale (default: 5 step times, at least 10 s)\n"
          "      --metrics-tls MODE  auto, on or off: serve HTTPS with a certificate made\n"
          "                          for the job (default auto: on unless the address is\n"
          "                          loopback, i.e. on with several Slurm nodes)\n"
          "      --metrics-cert F, --metrics-key F  serve HTTPS with this certificate and\n"
          "                          private key (PEM) instead\n"
          "Supervision and output:\n"
          "      --grace SECONDS     after the first failure, SIGTERM the others and\n"
          "                          SIGKILL them this much later (default 5; SECONDS here\n"
          "                          and elsewhere: plain decimal, such as 5 or 2.5)\n"
          "      --max-restarts N    after a rank fails, end the job and start it again, up\n"
          "                          to N times (default 0); ranks see BMT_RESTART=k\n"
          "      --log-dir DIR       write each rank's output to DIR/rank-N.log\n"
          "      --tee               with --log-dir: also print to the console\n"
          "      --no-label          do not prefix output lines with \"RANK: \"\n"
          "  -v, --verbose           say what bmlaunch does\n"
          "  -h, --help              this text\n"
          "      --help-env          the BMT_ environment variables, their defaults and meaning\n"
          "  -V, --version           version\n"
          "\n"
          "Exit status: 0 when every rank exits 0; otherwise the first failing rank's\n"
          "exit code, 128+N if it was killed by signal N, or its PMIx_Abort status\n"
          "(of the last run, after restarts); 128+N when signal N sent to bmlaunch\n"
          "ended the job and no rank failed (143 for SIGTERM, 130 for SIGINT); 2 for\n"
          "bad usage; 1 when bmlaunch itself fails. See bmlaunch(1).\n",
          out);
}

void cli_env_help(FILE *out)
{
    fputs("Environment variables read by bmlaunch and libbmt (docs/env.md):\n", out);
    for (const env_knob_t *k = env_knobs(); k->name; k++)
        fprintf(out, "  %-24s %-8s %s\n", k->name, k->deflt ? k->deflt : "-", k->doc);
}

/* Seconds as a plain decimal number: digits with at most one '.', nothing else.
 * strtod alone would also take " 5", "+5", "1e3", "inf" and hex ("0x10" is 16). */
static int parse_seconds(const char *text, const char *what, bool allow_zero, double *out,
                         bmt_error_t *err)
{
    bool plain = env_plain_decimal(text);
    double d = plain ? strtod(text, NULL) : -1;
    if (!plain || (!allow_zero && d == 0) || d > 1e7)
        return errprintf(err,
                         "%s needs a %s number of seconds, got '%.200s' (plain decimal, such as "
                         "5 or 2.5; at most 10000000)",
                         what, allow_zero ? "non-negative" : "positive", text);
    *out = d;
    return 0;
}

/* n digits (1 or more) at *p, value into *v; advances *p. */
static bool digits(const char **p, long *v)
{
    const char *s = *p;
    if (*s < '0' || *s > '9')
        return false;
    long x = 0;
    while (*s >= '0' && *s <= '9') {
        if (x > 100000000)
            return false;
        x = x * 10 + (*s++ - '0');
    }
    *v = x;
    *p = s;
    return true;
}

long cli_slurm_time_seconds(const char *t)
{
    if (strcmp(t, "UNLIMITED") == 0 || strcmp(t, "INFINITE") == 0)
        return 0;
    const char *p = t;
    long f[4], d = 0;
    int n = 0;
    bool days = strchr(t, '-') != NULL;
    if (days) {
        if (!digits(&p, &d) || *p++ != '-')
            return -1;
    }
    while (n < 3) {
        if (!digits(&p, &f[n++]))
            return -1;
        if (*p != ':')
            break;
        p++;
    }
    if (*p != '\0' || n > 3)
        return -1;
    /* Every field after the first is below 60 (the hours of D-HH below 24). */
    if (days && f[0] > 23)
        return -1;
    for (int i = 1; i < n; i++)
        if (f[i] > 59)
            return -1;
    /* sbatch's forms: M, M:S, H:M:S; D-H, D-H:M, D-H:M:S. */
    long s;
    if (days)
        s = d * 86400 + f[0] * 3600 + (n > 1 ? f[1] * 60 : 0) + (n > 2 ? f[2] : 0);
    else if (n == 1)
        s = f[0] * 60;
    else if (n == 2)
        s = f[0] * 60 + f[1];
    else
        s = f[0] * 3600 + f[1] * 60 + f[2];
    return s; /* 0: Slurm imposes no limit */
}

bool cli_slurm_time_ok(const char *t) { return cli_slurm_time_seconds(t) >= 0; }

int cli_parse(int argc, char **argv, launch_opts_t *o, bmt_error_t *err)
{
    *o = (launch_opts_t){
        .groups = 1,
        .gpus_per_group = 1,
        .grace_s = 5.0,
        .label = true,
        .signal_lead = 120,
        .cost = COSTMODEL_OPTS_INITIALIZER,
        .metrics_port = COLLECTOR_DEFAULT_PORT,
        .metrics_bind = "127.0.0.1",
        .metrics_linger_s = -1, /* until the next scrape (collector_linger_auto) */
    };
    opterr = 0; /* we write our own messages */
    optind = 0; /* GNU: 0 also resets getopt's state left by an earlier parse */
    int c;
    int li = -1;
    char optname[48]; /* "--NAME" of the long option just parsed (the cost model's) */
    const char *for_collector = NULL; /* the first option given that only the collector uses */
    bool signal_lead_given = false;   /* its default (120) is a value, not a sign of it */
    char run_only[48] = "";           /* the first option given that only a run uses */
    while ((c = getopt_long(argc, argv, "+:g:n:N:vhV", long_opts, &li)) != -1) {
        snprintf(optname, sizeof(optname), "--%s", li >= 0 ? long_opts[li].name : "?");
        li = -1;
        switch (c) { /* what --plan would ignore (it prints, runs nothing) */
        case OPT_DEVICE:
        case OPT_BACKEND:
        case OPT_GRACE:
        case OPT_TIMEOUT:
        case OPT_LOG_DIR:
        case OPT_TEE:
        case OPT_NO_LABEL:
        case OPT_LOCAL:
        case OPT_METRICS_PORT:
        case OPT_METRICS_BIND:
        case OPT_METRICS_PER_RANK:
        case OPT_METRICS_LINGER:
        case OPT_METRICS_SD_FILE:
        case OPT_METRICS_STALE:
        case OPT_METRICS_TLS:
        case OPT_METRICS_CERT:
        case OPT_METRICS_KEY:
        case OPT_MAX_RESTARTS:
            if (run_only[0] == '\0')
                snprintf(run_only, sizeof(run_only), "%s", optname);
            break;
        default: break;
        }
        switch (c) {
        case 'g':
            if (bmt_parse_positive(optarg, "--groups", &o->groups, err) < 0)
                return -1;
            break;
        case 'n':
            if (bmt_parse_positive(optarg, "--gpus-per-group", &o->gpus_per_group, err) < 0)
                return -1;
            break;
        case OPT_GPN:
            if (bmt_parse_positive(optarg, "--gpus-per-node", &o->gpus_per_node, err) < 0)
                return -1;
            break;
        case 'N':
            if (bmt_parse_positive(optarg, "--nodes", &o->nodes, err) < 0)
                return -1;
            break;
        case OPT_DEVICE:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
                return errprintf(err, "--device must be cpu or cuda, got '%.200s'", optarg);
            o->device = optarg;
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "shm") != 0 && strcmp(optarg, "nccl") != 0 &&
                strcmp(optarg, "none") != 0)
                return errprintf(err, "--backend must be shm, nccl or none, got '%.200s'", optarg);
            o->backend = optarg;
            break;
        case OPT_PLAN: o->plan = true; break;
        case OPT_JSON: o->json = true; break;
        case OPT_GRACE:
            if (parse_seconds(optarg, "--grace", true, &o->grace_s, err) < 0)
                return -1;
            break;
        case OPT_TIMEOUT:
            if (parse_seconds(optarg, "--timeout", false, &o->timeout_s, err) < 0)
                return -1;
            break;
        case OPT_LOG_DIR:
            if (*optarg == '\0')
                return errprintf(err, "--log-dir needs a directory");
            o->log_dir = optarg;
            break;
        case OPT_TEE: o->tee = true; break;
        case OPT_NO_LABEL: o->label = false; break;
        case 'v': o->verbose++; break;
        case 'h': cli_usage(stdout); return 1;
        case OPT_HELP_ENV: cli_env_help(stdout); return 1;
        case OPT_LOCAL: o->local = true; break;
        case OPT_SBATCH: o->sbatch = true; break;
        case OPT_SUBMIT: o->submit = true; break;
        case OPT_TIME:
        case OPT_PARTITION:
        case OPT_ACCOUNT:
        case OPT_JOB_NAME:
        case OPT_OUTPUT:
        case OPT_TEMPLATE: {
            /* argv[optind - 1] is the value when it came as its own word. */
            const char *name = c == OPT_TIME        ? "--time"
                               : c == OPT_PARTITION ? "--partition"
                               : c == OPT_ACCOUNT   ? "--account"
                               : c == OPT_JOB_NAME  ? "--job-name"
                               : c == OPT_OUTPUT    ? "--output"
                                                    : "--template";
            if (*optarg == '\0' || strpbrk(optarg, "\n\r"))
                return errprintf(err, "%s needs a value on one line", name);
            if (optarg[0] == '-')
                return errprintf(err, "%s needs a value, got the option '%.200s'", name, optarg);
            /* sbatch ends a directive's value at white space and at '#' (the
             * rest is a comment: --output 'o#1' wrote to o), and a value of
             * the script line must not need quoting. */
            if (c != OPT_TEMPLATE && strpbrk(optarg, " \t\v\f'\"\\$`#"))
                return errprintf(err,
                                 "%s '%.200s': no spaces, quotes, $, backslashes or '#' (sbatch "
                                 "would cut or refuse the #SBATCH line there)",
                                 name, optarg);
            if (c == OPT_TIME && !cli_slurm_time_ok(optarg))
                return errprintf(err,
                                 "--time '%.200s' is not a Slurm time limit: give MINUTES, "
                                 "MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, "
                                 "DAYS-HOURS:MINUTES or DAYS-HOURS:MINUTES:SECONDS (e.g. "
                                 "12:00:00), or UNLIMITED",
                                 optarg);
        }
            if (c == OPT_TIME)
                o->time = optarg;
            else if (c == OPT_PARTITION)
                o->partition = optarg;
            else if (c == OPT_ACCOUNT)
                o->account = optarg;
            else if (c == OPT_JOB_NAME)
                o->job_name = optarg;
            else if (c == OPT_OUTPUT)
                o->output = optarg;
            else
                o->template_path = optarg;
            break;
        case OPT_MODEL: {
            double params;
            if (costmodel_parse_params(optarg, "--model", &params, err) < 0)
                return -1;
            o->cost.model = optarg;
            break;
        }
        case OPT_BUSBW_GROUP:
        case OPT_BUSBW_REPLICA:
        case OPT_BUSBW_FLAT:
        case OPT_NVLINK_BUSBW:
        case OPT_NIC_BUSBW:
            if (costmodel_parse_gbps(optarg, optname,
                                     c == OPT_BUSBW_GROUP     ? &o->cost.busbw_group
                                     : c == OPT_BUSBW_REPLICA ? &o->cost.busbw_replica
                                     : c == OPT_BUSBW_FLAT    ? &o->cost.busbw_world
                                     : c == OPT_NVLINK_BUSBW  ? &o->cost.nvlink_gbps
                                                              : &o->cost.nic_gbps,
                                     err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_LATENCY_US:
        case OPT_CALL_US:
            if (costmodel_parse_us(optarg, optname,
                                   c == OPT_LATENCY_US ? &o->cost.latency_us : &o->cost.call_us,
                                   err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_ZERO:
            if (costmodel_parse_zero(optarg, "--zero", &o->cost.zero_level, err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_GRAD_DTYPE:
            if (costmodel_parse_dtype(optarg, "--grad-dtype", &o->cost.grad_bytes, err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_LAYERS:
        case OPT_SEQ_LEN:
        case OPT_MICRO_BATCH:
        case OPT_ACCUM:
            if (bmt_parse_positive(optarg, optname,
                                   c == OPT_LAYERS        ? &o->cost.layers
                                   : c == OPT_SEQ_LEN     ? &o->cost.seq
                                   : c == OPT_MICRO_BATCH ? &o->cost.micro_batch
                                                          : &o->cost.accum,
                                   err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_CKPT:
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                return errprintf(err, "--ckpt must be 0 or 1, got '%.200s'", optarg);
            o->cost.ckpt = optarg[0] == '1';
            o->comm_opts = true;
            break;
        case OPT_KEEP_ATTENTION:
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                return errprintf(err, "--keep-attention must be 0 or 1, got '%.200s'", optarg);
            o->cost.keep_attention = optarg[0] == '1';
            o->comm_opts = true;
            break;
        case OPT_FP8:
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                return errprintf(err, "--fp8 must be 0 or 1, got '%.200s'", optarg);
            o->cost.fp8 = optarg[0] == '1';
            o->comm_opts = true;
            break;
        case OPT_FP8_SPEEDUP:
            if (costmodel_parse_speedup(optarg, "--fp8-speedup", &o->cost.fp8_speedup, err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_CKPT_BUDGET:
            if (costmodel_parse_mib(optarg, "--ckpt-budget", &o->cost.ckpt_budget_mib, err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_MFU:
            if (costmodel_parse_fraction(optarg, "--mfu", &o->cost.mfu, err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_GPU:
            if (costmodel_gpu(optarg) == NULL)
                return errprintf(err,
                                 "--gpu must be h200, h100, a100 or b200, got '%.200s' (for "
                                 "another GPU give --mfu, --gpu-mem and --nvlink-busbw)",
                                 optarg);
            o->cost.gpu = optarg;
            o->comm_opts = true;
            break;
        case OPT_GPU_MEM:
            if (costmodel_parse_gib(optarg, "--gpu-mem", &o->cost.gpu_mem_gib, err) < 0)
                return -1;
            o->comm_opts = true;
            break;
        case OPT_SIGNAL_LEAD:
            if (bmt_parse_positive(optarg, "--signal-lead", &o->signal_lead, err) < 0)
                return -1;
            signal_lead_given = true;
            if (o->signal_lead > CLI_MAX_SIGNAL_LEAD)
                return errprintf(err,
                                 "--signal-lead %d: Slurm takes at most %d seconds (sbatch "
                                 "--signal)",
                                 o->signal_lead, CLI_MAX_SIGNAL_LEAD);
            break;
        case OPT_METRICS_PORT: {
            char *end = NULL;
            errno = 0;
            long p = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || errno || p < 0 || p > 65535)
                return errprintf(err,
                                 "--metrics-port needs a port from 0 (off) to 65535, got "
                                 "'%.200s'",
                                 optarg);
            o->metrics_port = (int)p;
            o->metrics_port_set = true;
            break;
        }
        case OPT_METRICS_BIND: {
            unsigned char addr[sizeof(struct in6_addr)];
            if (inet_pton(AF_INET, optarg, addr) != 1 && inet_pton(AF_INET6, optarg, addr) != 1)
                return errprintf(err,
                                 "--metrics-bind needs a numeric IPv4 or IPv6 address (127.0.0.1, "
                                 "0.0.0.0, ::1), got '%.200s'",
                                 optarg);
            o->metrics_bind = optarg;
            o->metrics_bind_set = true;
            if (for_collector == NULL)
                for_collector = "--metrics-bind";
            break;
        }
        case OPT_METRICS_PER_RANK:
            o->metrics_per_rank = true;
            if (for_collector == NULL)
                for_collector = "--metrics-per-rank";
            break;
        case OPT_METRICS_LINGER:
            if (parse_seconds(optarg, "--metrics-linger", true, &o->metrics_linger_s, err) < 0)
                return -1;
            if (for_collector == NULL)
                for_collector = "--metrics-linger";
            break;
        case OPT_METRICS_STALE:
            if (parse_seconds(optarg, "--metrics-stale", false, &o->metrics_stale_s, err) < 0)
                return -1;
            if (for_collector == NULL)
                for_collector = "--metrics-stale";
            break;
        case OPT_METRICS_SD_FILE:
            if (optarg[0] == '\0' || optarg[strlen(optarg) - 1] == '/')
                return errprintf(err, "--metrics-sd-file needs a file name, got '%.200s'", optarg);
            o->metrics_sd_file = optarg;
            break;
        case OPT_METRICS_TLS:
            if (strcmp(optarg, "auto") == 0)
                o->metrics_tls = TLS_AUTO;
            else if (strcmp(optarg, "on") == 0)
                o->metrics_tls = TLS_ON;
            else if (strcmp(optarg, "off") == 0)
                o->metrics_tls = TLS_OFF;
            else
                return errprintf(err, "--metrics-tls must be auto, on or off, got '%.200s'",
                                 optarg);
            break;
        case OPT_METRICS_CERT:
        case OPT_METRICS_KEY:
            if (optarg[0] == '\0')
                return errprintf(err, "%s needs a file name",
                                 c == OPT_METRICS_CERT ? "--metrics-cert" : "--metrics-key");
            *(c == OPT_METRICS_CERT ? &o->metrics_cert : &o->metrics_key) = optarg;
            break;
        case OPT_MAX_RESTARTS: {
            /* Digits only: strtol alone would take " 3", "+3" and "3 ". */
            size_t digits = strspn(optarg, "0123456789");
            long n =
                digits > 0 && digits <= 4 && optarg[digits] == '\0' ? strtol(optarg, NULL, 10) : -1;
            if (n < 0 || n > MAX_RESTARTS)
                return errprintf(err, "--max-restarts needs a count from 0 to %d, got '%.200s'",
                                 MAX_RESTARTS, optarg);
            o->max_restarts = (int)n;
            break;
        }
        case 'V': printf("bmlaunch (bmt) %s\n", BMT_VERSION_STRING); return 1;
        case ':': return errprintf(err, "%s needs a value", argv[optind - 1]);
        case '?':
        default:
            if (optopt)
                return errprintf(err, "unknown option '-%c'", optopt);
            return errprintf(err, "unknown option '%.200s'", argv[optind - 1]);
        }
    }
    if (o->device == NULL) {
        /* Like the other BMT_ knobs, an exported BMT_DEVICE is honoured. */
        const char *env = getenv("BMT_DEVICE");
        if (env && strcmp(env, "cpu") != 0 && strcmp(env, "cuda") != 0)
            return errprintf(err, "BMT_DEVICE='%.200s' in the environment: use cpu or cuda", env);
        o->device = env ? env : "cpu";
    }
    if (o->json && !o->plan)
        return errprintf(err, "--json goes with --plan");
    if (o->plan && run_only[0])
        return errprintf(err,
                         "%s is for a run, and --plan runs nothing (it prints the layout and, "
                         "with --model, the cost model's ranking): drop %s or drop --plan",
                         run_only, run_only);
    if (o->cost.model && !o->plan)
        return errprintf(err, "--model goes with --plan");
    if (o->comm_opts && !o->cost.model)
        return errprintf(err, "the cost model's options (--seq-len, --micro-batch, --gpu, "
                              "--busbw-group, --latency-us, --zero, --grad-dtype, ...) go with "
                              "--model");
    if (o->sbatch && (o->plan || o->local))
        return errprintf(err, "--sbatch prints a batch script; it goes with neither --plan nor "
                              "--local");
    if (o->submit && !o->sbatch)
        return errprintf(err, "--submit goes with --sbatch: it hands the batch script to sbatch");
    /* Each of these only fills a line of the batch script: without --sbatch it
     * would do nothing (--signal-lead too: no USR1 is asked of Slurm then). */
    if (!o->sbatch && (o->time || o->partition || o->account || o->job_name || o->output ||
                       o->template_path || signal_lead_given))
        return errprintf(err, "--time, --partition, --account, --job-name, --output, "
                              "--signal-lead and --template go with --sbatch");
    if (o->sbatch) {
        /* USR1 at or before the job's start warns of nothing: Slurm would send
         * it at once (the template's default time counts as well). */
        const char *t = o->time ? o->time : CLI_DEFAULT_TIME;
        long limit = cli_slurm_time_seconds(t);
        if (limit > 0 && o->signal_lead >= limit)
            return errprintf(err,
                             "--signal-lead %d is not less than the time limit %s (%ld s%s): "
                             "USR1 would come at the job's start; give a shorter --signal-lead "
                             "or a longer --time",
                             o->signal_lead, t, limit, o->time ? "" : ", the default --time");
        /* sbatch(1): "the signal may be sent up to 60 seconds earlier than
         * specified" (slurmctld checks the limits periodically): with less
         * than that left before the lead, it came seconds into the job, and a
         * trainer saved and exited 0 having trained a few steps. */
        if (limit > 0 && (long)o->signal_lead + CLI_SIGNAL_EARLY >= limit) {
            char lead[64] = "a longer --time";
            if (limit - CLI_SIGNAL_EARLY > 1)
                snprintf(lead, sizeof(lead), "a --signal-lead of at most %ld or a longer --time",
                         limit - CLI_SIGNAL_EARLY - 1);
            return errprintf(err,
                             "--signal-lead %d and the time limit %s (%ld s%s): Slurm sends the "
                             "signal up to %d s early, so USR1 could come at the job's start; "
                             "give %s",
                             o->signal_lead, t, limit, o->time ? "" : ", the default --time",
                             CLI_SIGNAL_EARLY, lead);
        }
    }
    if (o->tee && !o->log_dir)
        return errprintf(err, "--tee goes with --log-dir");
    if (o->metrics_sd_file && o->metrics_port == 0)
        return errprintf(err, "--metrics-sd-file names the collector's port for Prometheus, but "
                              "--metrics-port 0 turns the collector off");
    if ((o->metrics_cert == NULL) != (o->metrics_key == NULL))
        return errprintf(err, "--metrics-cert and --metrics-key go together (the certificate and "
                              "its private key)");
    if (o->metrics_cert && o->metrics_tls == TLS_OFF)
        return errprintf(err, "--metrics-cert serves HTTPS, but --metrics-tls off turns it off");
    if ((o->metrics_cert || o->metrics_tls == TLS_ON) && o->metrics_port == 0)
        return errprintf(err, "--metrics-tls on and --metrics-cert are for the collector, but "
                              "--metrics-port 0 turns it off");
    /* As the two above: an option that would do nothing is a mistake to show. */
    if (for_collector && o->metrics_port == 0)
        return errprintf(err,
                         "%s is for the metrics collector, but --metrics-port 0 turns metrics off",
                         for_collector);
    if (o->backend && strcmp(o->backend, "shm") == 0 && strcmp(o->device, "cuda") == 0)
        return errprintf(err,
                         "--backend shm moves host memory; use --backend nccl with --device cuda");
    if (o->backend && strcmp(o->backend, "nccl") == 0 && strcmp(o->device, "cpu") == 0)
        return errprintf(err, "--backend nccl needs --device cuda");
    o->prog_argc = argc - optind;
    o->prog_argv = argv + optind;
    if (o->plan && o->prog_argc > 0)
        return errprintf(err, "--plan runs nothing; drop '%.200s' or drop --plan", o->prog_argv[0]);
    if (!o->plan && o->prog_argc == 0)
        return errprintf(err, "no program to run: bmlaunch [OPTIONS] -- PROGRAM [ARGS...]");
    return 0;
}
