/* tests/unit/test_cli.c — bmlaunch's option parser, table-driven.
 *
 * Valid command lines and the options they set; then bad ones with the message
 * each must give. (tests/integration/test_cli.sh checks the same through the
 * binary: exit status 2 and the message on stderr.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/layout.h"
#include "cli.h"
#include "sbatch.h"
#include "tlscert.h"
#include "tap.h"

#define MAXARGS 16

static int parse(const char *const *args, launch_opts_t *o, bmt_error_t *err)
{
    static char *argv[MAXARGS + 2]; /* prog_argv points into it after parse returns */
    static char copies[MAXARGS + 1][128];
    int argc = 0;
    snprintf(copies[0], sizeof(copies[0]), "bmlaunch");
    argv[argc++] = copies[0];
    for (; args[argc - 1] && argc <= MAXARGS; argc++) {
        snprintf(copies[argc], sizeof(copies[argc]), "%s", args[argc - 1]);
        argv[argc] = copies[argc];
    }
    argv[argc] = NULL;
    return cli_parse(argc, argv, o, err);
}

static void check_valid(void)
{
    launch_opts_t o;
    bmt_error_t err = { { 0 } };
    {
        const char *a[] = { "--groups", "2", "--gpus-per-group", "4", "--", "prog", "-x", NULL };
        ok(parse(a, &o, &err) == 0 && o.groups == 2 && o.gpus_per_group == 4 && o.prog_argc == 2 &&
               strcmp(o.prog_argv[0], "prog") == 0 && strcmp(o.prog_argv[1], "-x") == 0,
           "long options, -- and the program's own options");
    }
    {
        const char *a[] = { "-g", "3", "-n", "5", "hostname", "--groups", "9", NULL };
        ok(parse(a, &o, &err) == 0 && o.groups == 3 && o.gpus_per_group == 5 && o.prog_argc == 3 &&
               strcmp(o.prog_argv[1], "--groups") == 0,
           "options after the program belong to the program");
    }
    {
        const char *a[] = { "prog", NULL };
        ok(parse(a, &o, &err) == 0 && o.groups == 1 && o.gpus_per_group == 1 &&
               strcmp(o.device, "cpu") == 0 && o.backend == NULL && o.grace_s == 5.0 && o.label &&
               !o.plan && o.gpus_per_node == 0 && o.nodes == 0,
           "defaults: 1x1, cpu, backend by device, grace 5 s, labels on");
    }
    {
        const char *a[] = { "--groups", "20",     "--gpus-per-group", "50", "--gpus-per-node",
                            "8",        "--plan", "--json",           NULL };
        ok(parse(a, &o, &err) == 0 && o.plan && o.json && o.gpus_per_node == 8 && o.prog_argc == 0,
           "--plan --json needs no program");
    }
    {
        const char *a[] = { "--device",  "cuda", "--backend", "nccl",   "--grace", "0.5",
                            "--timeout", "30",   "--log-dir", "/tmp/x", "--tee",   "--no-label",
                            "-v",        "-N",   "2",         "p",      NULL };
        ok(parse(a, &o, &err) == 0 && strcmp(o.device, "cuda") == 0 &&
               strcmp(o.backend, "nccl") == 0 && o.grace_s == 0.5 && o.timeout_s == 30 &&
               strcmp(o.log_dir, "/tmp/x") == 0 && o.tee && !o.label && o.verbose == 1 &&
               o.nodes == 2,
           "every option sets its field");
    }
    {
        const char *a[] = {
            "--metrics-tls", "on", "--metrics-cert", "c.pem", "--metrics-key", "k.pem", "p", NULL
        };
        ok(parse(a, &o, &err) == 0 && o.metrics_tls == TLS_ON &&
               strcmp(o.metrics_cert, "c.pem") == 0 && strcmp(o.metrics_key, "k.pem") == 0,
           "--metrics-tls, --metrics-cert and --metrics-key set their fields");
        const char *d[] = { "p", NULL };
        ok(parse(d, &o, &err) == 0 && o.metrics_tls == TLS_AUTO && o.metrics_cert == NULL,
           "--metrics-tls defaults to auto");
    }
    {
        const char *a[] = { "--sbatch", "--time", "5", "--signal-lead", "239", "p", NULL };
        const char *b[] = {
            "--sbatch", "--time", "UNLIMITED", "--signal-lead", "65535", "p", NULL
        };
        const char *c[] = { "--sbatch", "--time", "0", "--signal-lead", "65535", "p", NULL };
        const char *d[] = { "--sbatch", "--signal-lead", "3539", "p", NULL };
        const char *e[] = { "--sbatch", "--submit", "p", NULL };
        ok(parse(a, &o, &err) == 0 && o.signal_lead == 239 && parse(b, &o, &err) == 0 &&
               parse(c, &o, &err) == 0 && parse(d, &o, &err) == 0 && parse(e, &o, &err) == 0 &&
               o.submit && o.sbatch,
           "--signal-lead more than 60 s below the time limit, any with no limit; --sbatch "
           "--submit");
        /* Slurm may send the signal up to 60 s early (sbatch(1)): within 60 s
         * of the limit it may come at the job's start. */
        const char *f[] = { "--sbatch", "--time", "5", "--signal-lead", "240", "p", NULL };
        const char *g[] = { "--sbatch", "--signal-lead", "3540", "p", NULL };
        const char *h[] = { "--sbatch", "--time", "1", "--signal-lead", "1", "p", NULL };
        ok(parse(f, &o, &err) == -1 &&
               strstr(err.text, "give a --signal-lead of at most 239 or a longer --time") &&
               parse(g, &o, &err) == -1 && strstr(err.text, "the default --time") &&
               parse(h, &o, &err) == -1 && strstr(err.text, "; give a longer --time"),
           "--signal-lead within 60 s of the time limit is refused (%s)", err.text);
    }
    {
        const char *a[] = { "--grace", "0", "p", NULL };
        ok(parse(a, &o, &err) == 0 && o.grace_s == 0, "--grace 0 (SIGKILL at once) is allowed");
    }
    {
        const char *a[] = { "p", NULL };
        ok(parse(a, &o, &err) == 0 && o.max_restarts == 0, "--max-restarts defaults to 0");
    }
    {
        const char *a[] = { "--max-restarts", "1000", "p", NULL };
        const char *b[] = { "--max-restarts", "0", "p", NULL };
        const char *c[] = { "--max-restarts", "007", "p", NULL };
        ok(parse(a, &o, &err) == 0 && o.max_restarts == 1000 && parse(b, &o, &err) == 0 &&
               o.max_restarts == 0 && parse(c, &o, &err) == 0 && o.max_restarts == 7,
           "--max-restarts takes 0 to 1000");
    }
}

static const struct {
    const char *args[8];
    const char *want;
} bad[] = {
    { { "--groups", "0", "p" }, "--groups must be at least 1" },
    { { "--groups", "-2", "p" }, "--groups needs a positive whole number, got '-2'" },
    { { "--groups", "two", "p" }, "--groups needs a positive whole number, got 'two'" },
    { { "--gpus-per-group", "4x", "p" }, "--gpus-per-group needs a positive whole number" },
    { { "--gpus-per-node", "", "p" },
      "--gpus-per-node needs a positive whole number, got nothing" },
    { { "--nodes", "99999999999", "p" }, "--nodes: '99999999999' is too large" },
    { { "--groups" }, "--groups needs a value" },
    { { "--frobnicate", "p" }, "unknown option '--frobnicate'" },
    { { "-z", "p" }, "unknown option '-z'" },
    { { "--device", "tpu", "p" }, "--device must be cpu or cuda, got 'tpu'" },
    { { "--backend", "mpi", "p" }, "--backend must be shm, nccl or none, got 'mpi'" },
    { { "--device", "cuda", "--backend", "shm", "p" }, "--backend shm moves host memory" },
    { { "--backend", "nccl", "p" }, "--backend nccl needs --device cuda" },
    { { "--grace", "-1", "p" }, "--grace needs a non-negative number of seconds, got '-1'" },
    { { "--grace", "soon", "p" }, "--grace needs a non-negative number of seconds" },
    { { "--timeout", "0", "p" }, "--timeout needs a positive number of seconds" },
    { { "--timeout", "nan", "p" }, "--timeout needs a positive number of seconds" },
    { { "--max-restarts", "1001", "p" },
      "--max-restarts needs a count from 0 to 1000, got '1001'" },
    { { "--max-restarts", "-1", "p" }, "--max-restarts needs a count from 0 to 1000, got '-1'" },
    { { "--max-restarts", "three", "p" }, "--max-restarts needs a count from 0 to 1000" },
    { { "--max-restarts", "", "p" }, "--max-restarts needs a count from 0 to 1000, got ''" },
    { { "--max-restarts", "2.5", "p" }, "--max-restarts needs a count from 0 to 1000" },
    { { "--max-restarts", "+2", "p" }, "--max-restarts needs a count from 0 to 1000" },
    { { "--max-restarts", "99999999999999999999", "p" }, "--max-restarts needs a count" },
    { { "--max-restarts" }, "--max-restarts needs a value" },
    { { "--sbatch", "--time", "99:99:99x", "p" }, "--time '99:99:99x' is not a Slurm time limit" },
    { { "--sbatch", "--time", "1:60:00", "p" }, "--time '1:60:00' is not a Slurm time limit" },
    { { "--sbatch", "--time", "2-25", "p" }, "--time '2-25' is not a Slurm time limit" },
    { { "--sbatch", "--time", "1:2:3:4", "p" }, "--time '1:2:3:4' is not a Slurm time limit" },
    { { "--sbatch", "--time", "soon", "p" }, "--time 'soon' is not a Slurm time limit" },
    { { "--sbatch", "--time", "--", "p" }, "--time needs a value, got the option '--'" },
    { { "--sbatch", "--partition", "a b", "p" }, "--partition 'a b': no spaces, quotes" },
    { { "--sbatch", "--account", "x$y", "p" }, "--account 'x$y': no spaces, quotes" },
    { { "--sbatch", "--job-name", "it's", "p" }, "--job-name 'it's': no spaces, quotes" },
    { { "--sbatch", "--output", "", "p" }, "--output needs a value on one line" },
    { { "--sbatch", "--output=", "p" }, "--output needs a value on one line" },
    { { "--sbatch", "--partition", "-v", "p" }, "--partition needs a value, got the option '-v'" },
    { { "--sbatch", "--signal-lead", "65536", "p" },
      "--signal-lead 65536: Slurm takes at most 65535 seconds" },
    { { "--sbatch", "--time", "5", "--signal-lead", "300", "p" },
      "--signal-lead 300 is not less than the time limit 5 (300 s)" },
    { { "--sbatch", "--time", "2-0", "--signal-lead", "172800", "p" },
      "--signal-lead 172800: Slurm takes at most 65535" },
    { { "--sbatch", "--time", "0:02:00", "--signal-lead", "120", "p" },
      "--signal-lead 120 is not less than the time limit 0:02:00 (120 s)" },
    { { "--sbatch", "--signal-lead", "3600", "p" },
      "--signal-lead 3600 is not less than the time limit 01:00:00 (3600 s, the default --time)" },
    { { "--submit", "p" }, "--submit goes with --sbatch" },
    { { "--signal-lead", "60", "p" }, "--signal-lead and --template go with --sbatch" },
    { { "--signal-lead", "120", "p" }, "--signal-lead and --template go with --sbatch" },
    { { "--time", "10", "p" }, "--output, --signal-lead and --template go with --sbatch" },
    { { "--metrics-stale", "0", "p" }, "--metrics-stale needs a positive number of seconds" },
    { { "--metrics-stale", "soon", "p" }, "--metrics-stale needs a positive number of seconds" },
    { { "--json", "p" }, "--json goes with --plan" },
    { { "--tee", "p" }, "--tee goes with --log-dir" },
    { { "--log-dir", "", "p" }, "--log-dir needs a directory" },
    { { "--metrics-sd-file", "", "p" }, "--metrics-sd-file needs a file name, got ''" },
    { { "--metrics-sd-file", "sd/", "p" }, "--metrics-sd-file needs a file name, got 'sd/'" },
    { { "--metrics-port", "0", "--metrics-sd-file", "t.json", "p" },
      "--metrics-sd-file names the collector's port for Prometheus, but --metrics-port 0" },
    { { "--metrics-tls", "yes", "p" }, "--metrics-tls must be auto, on or off, got 'yes'" },
    { { "--metrics-cert", "c.pem", "p" }, "--metrics-cert and --metrics-key go together" },
    { { "--metrics-key", "k.pem", "p" }, "--metrics-cert and --metrics-key go together" },
    { { "--metrics-cert", "", "--metrics-key", "k.pem", "p" }, "--metrics-cert needs a file name" },
    { { "--metrics-tls", "off", "--metrics-cert", "c", "--metrics-key", "k", "p" },
      "--metrics-cert serves HTTPS, but --metrics-tls off turns it off" },
    { { "--metrics-port", "0", "--metrics-tls", "on", "p" },
      "--metrics-tls on and --metrics-cert are for the collector, but --metrics-port 0" },
    { { "--plan", "p" }, "--plan runs nothing" },
    { { "--groups", "2" }, "no program to run" },
    { { "--" }, "no program to run" },
    { { NULL }, "no program to run" },
};

static void check_slurm_time(void)
{
    static const char *good[] = { "90",   "90:30",     "12:00:00",   "1-0",
                                  "2-12", "2-12:30",   "2-12:30:15", "100:00:00",
                                  "0:59", "UNLIMITED", "INFINITE",   "10080" };
    static const char *badt[] = { "",     "1:60",    "1:2:60", "1-24", "1-1:60",
                                  "1-",   "-1",      "1-1-1",  ":30",  "30:",
                                  "1::2", "1:2:3:4", "1h",     "12.5", "unlimited" };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        ok(cli_slurm_time_ok(good[i]), "a Slurm time limit: '%s'", good[i]);
    for (size_t i = 0; i < sizeof(badt) / sizeof(badt[0]); i++)
        ok(!cli_slurm_time_ok(badt[i]), "not a Slurm time limit: '%s'", badt[i]);
}

static void check_slurm_time_seconds(void)
{
    static const struct {
        const char *t;
        long s;
    } cases[] = { { "90", 5400 },           { "90:30", 5430 },  { "12:00:00", 43200 },
                  { "1-0", 86400 },         { "2-12", 216000 }, { "2-12:30", 217800 },
                  { "2-12:30:15", 217815 }, { "0:59", 59 },     { "UNLIMITED", 0 },
                  { "INFINITE", 0 },        { "0", 0 },         { "01:00:00", 3600 },
                  { "1:60", -1 },           { "soon", -1 },     { "", -1 } };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ok(cli_slurm_time_seconds(cases[i].t) == cases[i].s, "--time '%s' is %ld s", cases[i].t,
           cases[i].s);
}

/* The default job name: nothing that breaks an #SBATCH line gets through. */
static void check_job_name(void)
{
    static const struct {
        const char *prog, *want;
    } cases[] = {
        { "./train", "train" },
        { "/opt/bmt/bin/gpt2-train_v1.2", "gpt2-train_v1.2" },
        { "x\ntouch PWNED", "x_touch_PWNED" },
        { "./my prog", "my_prog" },
        { "./it's", "it_s" },
        { "a$b`c\\d\"e", "a_b_c_d_e" },
        { "./foo/", "bmt" },
        { "", "bmt" },
        { "/", "bmt" },
        { "caf\xc3\xa9", "caf__" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[SBATCH_JOB_NAME_MAX + 1];
        sbatch_job_name(cases[i].prog, name, sizeof(name));
        ok(strcmp(name, cases[i].want) == 0, "job name %zu is '%s' (got '%s')", i, cases[i].want,
           name);
    }
    char longp[400];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    char name[SBATCH_JOB_NAME_MAX + 1];
    sbatch_job_name(longp, name, sizeof(name));
    ok(strlen(name) == SBATCH_JOB_NAME_MAX, "a long name is cut to %d", SBATCH_JOB_NAME_MAX);
}

/* Seconds rendered into the batch script read back through bmlaunch's own
 * parser to the same double: every option that takes seconds, values %g
 * would write with an exponent (1e+06, 1e-05), and the extremes. */
static void check_seconds_round_trip(void)
{
    static char tiny[400];
    snprintf(tiny, sizeof(tiny), "0.%0320d", 5); /* 5e-320, a subnormal */
    const char *values[] = { "1000000",
                             "10000000",
                             "0.00001",
                             "0.000001",
                             "2.5",
                             "5",
                             "0.1",
                             "1234567.125",
                             "9999999.999999999",
                             "0.30000000000000004",
                             "7",
                             "123456789e-2" /* refused by the parser: skipped */,
                             tiny,
                             "0",
                             "0.0" };
    const char *opts[] = { "--timeout", "--grace", "--metrics-linger", "--metrics-stale" };
    for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++)
        for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
            char *a1[] = { "bmlaunch", (char *)opts[k], (char *)values[i], "p", NULL };
            launch_opts_t o1, o2;
            bmt_error_t err = { { 0 } };
            if (cli_parse(4, a1, &o1, &err) != 0)
                continue; /* not a value bmlaunch takes */
            double v = k == 0   ? o1.timeout_s
                       : k == 1 ? o1.grace_s
                       : k == 2 ? o1.metrics_linger_s
                                : o1.metrics_stale_s;
            char text[400];
            int rc = sbatch_seconds(text, sizeof(text), v);
            char *a2[] = { "bmlaunch", (char *)opts[k], text, "p", NULL };
            bool same = rc == 0 && !strpbrk(text, "eE") && cli_parse(4, a2, &o2, &err) == 0 &&
                        (k == 0   ? o2.timeout_s
                         : k == 1 ? o2.grace_s
                         : k == 2 ? o2.metrics_linger_s
                                  : o2.metrics_stale_s) == v;
            ok(same, "%s %.40s renders as %.40s and reads back the same", opts[k], values[i],
               rc == 0 ? text : "(nothing)");
            if (!same)
                diag("%s", err.text);
        }
    char text[8];
    ok(sbatch_seconds(text, sizeof(text), 1e-300) == -1 && sbatch_seconds(text, 8, -1) == -1,
       "too short a buffer or a negative value: refused");

    /* ... and in the script, on the bmlaunch line */
    char *argv[] = { "bmlaunch",
                     "--template",
                     "templates/bmt.sbatch",
                     "--sbatch",
                     "-n",
                     "2",
                     "--gpus-per-node",
                     "2",
                     "--timeout",
                     "1000000",
                     "--grace",
                     "0.00001",
                     "--metrics-linger",
                     "0.000001",
                     "--metrics-stale",
                     "9999999.5",
                     "--",
                     "p",
                     NULL };
    launch_opts_t o;
    bmt_error_t err = { { 0 } };
    bmt_layout_t l;
    char *script = cli_parse(18, argv, &o, &err) == 0 && bmt_layout_make(&l, 1, 2, 2, 0, &err) == 0
                       ? sbatch_script(&o, &l, "/b", &err)
                       : NULL;
    ok(script && strstr(script, " --timeout 1000000 --grace 0.00001 ") &&
           strstr(script, " --metrics-linger 0.000001 --metrics-stale 9999999.5 "),
       "the script's bmlaunch line has plain decimals (%s)", script ? "" : err.text);
    free(script);
}

static void check_bad(void)
{
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        launch_opts_t o;
        bmt_error_t err = { { 0 } };
        int rc = parse(bad[i].args, &o, &err);
        char line[128] = "";
        for (int k = 0; bad[i].args[k]; k++)
            snprintf(line + strlen(line), sizeof(line) - strlen(line), "%s'%s'", k ? " " : "",
                     bad[i].args[k]);
        ok(rc == -1 && strstr(err.text, bad[i].want) != NULL, "bad: %s -> %s", line, bad[i].want);
        if (rc != -1 || strstr(err.text, bad[i].want) == NULL)
            diag("rc %d, message '%s'", rc, err.text);
    }
}

int main(void)
{
    check_valid();
    check_bad();
    check_slurm_time();
    check_slurm_time_seconds();
    check_job_name();
    check_seconds_round_trip();
    return done_testing();
}
