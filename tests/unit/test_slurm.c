/* tests/unit/test_slurm.c — the pure parts of Slurm mode and of --sbatch.
 *
 * Allocation parsing from a fake environment, the layout-fits-allocation check,
 * srun's argument vector, and the template renderer (fields, dropped lines,
 * unknown fields) with shell quoting. tests/slurm/ runs the same code against
 * a real cluster.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sbatch.h"
#include "slurm.h"
#include "tap.h"

/* ------------------------------------------------------------ a fake environment */

static const char *const *fake_env;

static const char *fake_get(const char *name)
{
    for (const char *const *p = fake_env; p && *p; p += 2)
        if (strcmp(p[0], name) == 0)
            return p[1];
    return NULL;
}

static int detect(const char *const *env, slurm_alloc_t *a, bmt_error_t *err)
{
    fake_env = env;
    memset(err, 0, sizeof(*err));
    return slurm_detect_from(a, fake_get, err);
}

static void check_uniform(void)
{
    static const struct {
        const char *text;
        int rc, value;
    } cases[] = {
        { "8", 0, 8 },       { "4(x2)", 0, 4 },  { "2,2", 0, 2 },   { "4(x3),4", 0, 4 },
        { "4(x2),2", 0, 0 }, { "1,2", 0, 0 },    { "", -1, 0 },     { "x", -1, 0 },
        { "4(x)", -1, 0 },   { "4(y2)", -1, 0 }, { "4(x2", -1, 0 }, { "0", -1, 0 },
        { "-4", -1, 0 },     { "4,", 0, 4 },     { "4;4", -1, 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int v = -7;
        int rc = slurm_uniform_count(cases[i].text, &v);
        ok(rc == cases[i].rc && (rc < 0 || v == cases[i].value), "uniform count '%s' -> %d (%d)",
           cases[i].text, cases[i].rc, cases[i].value);
    }
}

static void check_detect(void)
{
    slurm_alloc_t a;
    bmt_error_t err;
    static const char *const none[] = { "HOME", "/root", NULL };
    is_int(detect(none, &a, &err), 0, "no SLURM_JOB_ID: not in an allocation");

    static const char *const two[] = { "SLURM_JOB_ID",
                                       "42",
                                       "SLURM_JOB_NUM_NODES",
                                       "2",
                                       "SLURM_TASKS_PER_NODE",
                                       "4(x2)",
                                       "SLURM_JOB_CPUS_PER_NODE",
                                       "64(x2)",
                                       "SLURM_GPUS_ON_NODE",
                                       "4",
                                       NULL };
    ok(detect(two, &a, &err) == 1 && strcmp(a.job_id, "42") == 0 && a.nodes == 2 &&
           a.tasks_per_node == 4 && a.cpus_per_node == 64 && a.gpus_per_node == 4,
       "a two-node GPU allocation is read whole");

    static const char *const old[] = { "SLURM_JOB_ID", "7", "SLURM_NNODES", "3", NULL };
    ok(detect(old, &a, &err) == 1 && a.nodes == 3 && a.tasks_per_node == 0 && a.gpus_per_node == 0,
       "SLURM_NNODES serves when SLURM_JOB_NUM_NODES is absent; the rest is optional");

    /* The interactive step (use_interactive_step) is 0xfffffffa: srun runs there. */
    static const char *const interactive[] = {
        "SLURM_JOB_ID", "8", "SLURM_JOB_NUM_NODES", "1", "SLURM_STEP_ID", "4294967290", NULL
    };
    ok(detect(interactive, &a, &err) == 1 && a.nodes == 1,
       "the interactive step's SLURM_STEP_ID is an allocation to start srun from");

    static const char *const bad[][7] = {
        { "SLURM_JOB_ID", "9", "SLURM_JOB_NUM_NODES", "1", "SLURM_STEP_ID", "0", NULL },
        { "SLURM_JOB_ID", "9", "SLURM_JOB_NUM_NODES", "1", "SLURM_STEPID", "3", NULL },
        { "SLURM_JOB_ID", "1", NULL },
        { "SLURM_JOB_ID", "1", "SLURM_JOB_NUM_NODES", "two", NULL },
        { "SLURM_JOB_ID", "1", "SLURM_JOB_NUM_NODES", "2", "SLURM_TASKS_PER_NODE", "4(x", NULL },
        { "SLURM_JOB_ID", "1", "SLURM_JOB_NUM_NODES", "2", "SLURM_GPUS_ON_NODE", "-1", NULL },
    };
    static const char *const want[] = { "bmlaunch runs as a task of job step 9.0 (srun started it)",
                                        "job step 9.3",
                                        "SLURM_NNODES is not set",
                                        "SLURM_JOB_NUM_NODES",
                                        "SLURM_TASKS_PER_NODE='4(x' is malformed",
                                        "SLURM_GPUS_ON_NODE" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = detect(bad[i], &a, &err);
        ok(rc == -1 && strstr(err.text, want[i]), "malformed allocation %zu: '%s'", i, want[i]);
        if (rc != -1 || !strstr(err.text, want[i]))
            diag("got %d '%s'", rc, err.text);
    }
}

static launch_opts_t opts(int groups, int gpg, int gpn, const char *device)
{
    static char *prog[] = { (char *)"./train", (char *)"--steps", (char *)"10", NULL };
    launch_opts_t o = { 0 };
    o.groups = groups;
    o.gpus_per_group = gpg;
    o.gpus_per_node = gpn;
    o.device = device;
    o.prog_argc = 3;
    o.prog_argv = prog;
    return o;
}

static int has_arg(char **argv, const char *a)
{
    for (char **p = argv; p && *p; p++)
        if (strcmp(*p, a) == 0)
            return 1;
    return 0;
}

static void check_plan(void)
{
    slurm_alloc_t gpu = { "42", 2, 4, 64, 4 }, cpu = { "9", 1, 8, 2, 0 };
    bmt_layout_t l;
    bmt_error_t err = { { 0 } };
    launch_opts_t o = opts(2, 4, 0, "cuda");
    ok(slurm_plan(&gpu, &o, &l, &err) == 0 && l.gpus_per_node == 4 && l.nodes == 2,
       "cuda: GPUs per node from the allocation; 2 x 4 fills 2 nodes of 4");
    char **v = slurm_srun_argv(&gpu, &o, &l, "/opt/bmt/bin/bmlaunch", "bmlaunch.7.0");
    ok(v && strcmp(v[0], "srun") == 0 && has_arg(v, "--mpi=pmix") && has_arg(v, "--nodes=2") &&
           has_arg(v, "--ntasks=8") && has_arg(v, "--ntasks-per-node=4") &&
           has_arg(v, "--distribution=block") && !has_arg(v, "--kill-on-bad-exit=1") &&
           has_arg(v, "--job-name=bmlaunch.7.0") && has_arg(v, "--label") &&
           has_arg(v, "--gpu-bind=none") && has_arg(v, "--cpus-per-task=16") &&
           has_arg(v, "--cpu-bind=cores") && !has_arg(v, "--overcommit"),
       "cuda srun line: pmix, one task per GPU, block, the step's name, no kill-on-bad-exit "
       "(bmlaunch ends the step), label, no GPU binding, "
       "16 bound cores per task");
    ok(v && has_arg(v, "--export=ALL"),
       "srun passes bmlaunch's environment to the tasks (--export=ALL) even where an "
       "sbatch --export=NONE left SLURM_EXPORT_ENV=NONE");
    int k = 0;
    while (v && v[k] && strcmp(v[k], "/opt/bmt/bin/bmlaunch") != 0)
        k++;
    ok(v && v[k] && strcmp(v[k + 1], "--rank-exec") == 0 && strcmp(v[k + 2], "--") == 0 &&
           strcmp(v[k + 3], "./train") == 0 && strcmp(v[k + 5], "10") == 0 && v[k + 6] == NULL,
       "each task runs bmlaunch --rank-exec -- the program and its arguments");
    slurm_argv_free(v);

    o = opts(1, 8, 0, "cpu");
    ok(slurm_plan(&cpu, &o, &l, &err) == 0 && l.gpus_per_node == 8, "cpu: tasks per node");
    v = slurm_srun_argv(&cpu, &o, &l, "/b", "s");
    ok(v && has_arg(v, "--overcommit") && has_arg(v, "--cpu-bind=none") &&
           !has_arg(v, "--gpu-bind=none"),
       "cpu ranks beyond the cores: --overcommit, unbound");
    slurm_argv_free(v);

    static const struct {
        slurm_alloc_t a;
        int groups, gpg, gpn;
        const char *device, *want;
    } bad[] = {
        { { "42", 2, 4, 64, 4 }, 2, 8, 0, "cuda", "need 4 nodes, but allocation 42 has 2" },
        { { "42", 2, 4, 64, 0 }, 1, 2, 0, "cuda", "has no GPUs" },
        { { "42", 2, 4, 64, 4 },
          1,
          8,
          8,
          "cuda",
          "--gpus-per-node 8 but the nodes of allocation 42 have 4 GPUs each; give "
          "--gpus-per-node 4 or less, or ask Slurm for nodes with 8 GPUs" },
        { { "42", 1, 2, 2, 0 },
          1,
          4,
          4,
          "cuda",
          "4 ranks a node (one task a GPU) need 4 CPUs a node, but the nodes of allocation 42 "
          "have 2; ask Slurm for --ntasks-per-node 4" },
        { { "42", 2, 0, 0, 0 }, 1, 3, 0, "cpu", "cannot tell the ranks per node" },
        { { "42", 1, 4, 4, 0 },
          3,
          1,
          0,
          "cpu",
          "allocation 42 has 4 tasks a node (SLURM_TASKS_PER_NODE), the ranks a node unless "
          "--gpus-per-node says otherwise: 3 ranks (3 x 1) do not fill whole nodes of 4" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        o = opts(bad[i].groups, bad[i].gpg, bad[i].gpn, bad[i].device);
        memset(&err, 0, sizeof(err));
        int rc = slurm_plan(&bad[i].a, &o, &l, &err);
        ok(rc == -1 && strstr(err.text, bad[i].want), "does not fit: '%s'", bad[i].want);
        if (rc != -1 || !strstr(err.text, bad[i].want))
            diag("got %d '%s'", rc, err.text);
    }

    /* --nodes without --gpus-per-node: ranks per node are the world divided by
     * the nodes (bmlaunch(1)), not the allocation's GPUs or tasks, which the
     * world would not fill. */
    slurm_alloc_t gpu8 = { "43", 2, 8, 64, 8 }, cpu4 = { "44", 2, 4, 4, 0 };
    o = opts(1, 8, 0, "cuda");
    o.nodes = 2;
    memset(&err, 0, sizeof(err));
    ok(slurm_plan(&gpu8, &o, &l, &err) == 0 && l.gpus_per_node == 4 && l.nodes == 2 && l.world == 8,
       "cuda, --nodes 2, 8 ranks on nodes of 8 GPUs: 4 ranks on each node (%s)", err.text);
    o = opts(2, 2, 0, "cpu");
    o.nodes = 2;
    ok(slurm_plan(&cpu4, &o, &l, &err) == 0 && l.gpus_per_node == 2 && l.nodes == 2,
       "cpu, --nodes 2, 4 ranks on nodes of 4 tasks: 2 ranks on each node");
    o = opts(1, 32, 0, "cuda");
    o.nodes = 2;
    memset(&err, 0, sizeof(err));
    ok(slurm_plan(&gpu8, &o, &l, &err) == -1 &&
           strstr(err.text, "--nodes 2 puts 16 ranks on a node, but the nodes of allocation 43 "
                            "have 8 GPUs each"),
       "cuda, --nodes 2, 32 ranks: more on a node than its GPUs, refused (%s)", err.text);
    o = opts(1, 4, 0, "cuda");
    o.nodes = 3;
    memset(&err, 0, sizeof(err));
    ok(slurm_plan(&gpu8, &o, &l, &err) == -1 && strstr(err.text, "leave 2 of 6 GPUs idle"),
       "cuda, --nodes 3, 4 ranks: does not fill the nodes, refused (%s)", err.text);
    o = opts(1, 8, 0, "cuda");
    o.nodes = 4;
    memset(&err, 0, sizeof(err));
    ok(slurm_plan(&gpu8, &o, &l, &err) == -1 &&
           strstr(err.text, "need 4 nodes, but allocation 43 has 2"),
       "cuda, --nodes 4 in an allocation of 2: refused (%s)", err.text);
}

static void check_render(void)
{
    const sbatch_var_t vars[] = { { "A", "1", false }, { "B", "", false }, { "C", "x y", false } };
    bmt_error_t err = { { 0 } };
    char *out = sbatch_render("a={{A}}\nb={{B}}\nc={{C}}{{A}}\nplain\n", vars, 3, &err);
    is_str(out, "a=1\nc=x y1\nplain\n", "fields replaced; a line with an empty field dropped");
    free(out);
    out = sbatch_render("no newline {{A}}", vars, 3, &err);
    is_str(out, "no newline 1", "the last line without a newline");
    free(out);
    static const struct {
        const char *tmpl, *want;
    } bad[] = {
        { "x\n#SBATCH --time={{TIEM}}\n", "line 2: unknown field {{TIEM}}" },
        { "{{A}\n", "line 1: '{{' without '}}'" },
        { "ok\nx={{\n", "line 2: '{{' without '}}'" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&err, 0, sizeof(err));
        char *r = sbatch_render(bad[i].tmpl, vars, 3, &err);
        ok(r == NULL && strstr(err.text, bad[i].want), "bad template: '%s'", bad[i].want);
        free(r);
    }
    /* A required field (the program's) the template lacks, or on a line an
     * empty field leaves out: the script would run nothing. */
    const sbatch_var_t req[] = { { "A", "1", false }, { "B", "", false }, { "P", "'x'", true } };
    out = sbatch_render("a={{A}}\nrun {{P}}\n", req, 3, &err);
    is_str(out, "a=1\nrun 'x'\n", "a required field on a kept line");
    free(out);
    static const struct {
        const char *tmpl, *want;
    } bad_req[] = {
        { "a={{A}}\n", "the template has no {{P}}" },
        { "a={{A}}\nrun {{P}} {{B}}\n",
          "line 2: {{B}} is empty here, which leaves the line out, and with it {{P}}" },
        { "{{B}}{{P}}\nrun {{P}}\n", "line 1: {{B}} is empty here" },
    };
    for (size_t i = 0; i < sizeof(bad_req) / sizeof(bad_req[0]); i++) {
        memset(&err, 0, sizeof(err));
        char *r = sbatch_render(bad_req[i].tmpl, req, 3, &err);
        ok(r == NULL && strstr(err.text, bad_req[i].want), "required field: '%s' (%s)",
           bad_req[i].want, err.text);
        free(r);
    }
    static const struct {
        const char *in, *out;
    } q[] = {
        { "plain", "'plain'" },
        { "a b", "'a b'" },
        { "it's", "'it'\\''s'" },
        { "$HOME `x` \\n", "'$HOME `x` \\n'" },
        { "", "''" },
    };
    for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++) {
        char *s = shell_quote(q[i].in);
        is_str(s, q[i].out, "shell_quote");
        free(s);
    }
}

/* The words of a shell command line as shell_quote writes them: single quotes
 * (with '\'' inside), backslashes and blanks; up to the first "&" word. */
static int split_words(const char *line, char *store, size_t cap, char **words, int max)
{
    int n = 0;
    size_t k = 0;
    const char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0' || *p == '\n' || (*p == '&' && (p[1] == '\0' || p[1] == '\n')) ||
            n + 1 >= max)
            break;
        words[n++] = store + k;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n' && k + 1 < cap) {
            if (*p == '\'') {
                for (p++; *p && *p != '\'' && k + 1 < cap; p++)
                    store[k++] = *p;
                if (*p == '\'')
                    p++;
            } else if (*p == '\\' && p[1]) {
                store[k++] = p[1];
                p += 2;
            } else {
                store[k++] = *p++;
            }
        }
        store[k++] = '\0';
    }
    words[n] = NULL;
    return n;
}

static bool same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

/* Every option of the rendered bmlaunch line parses to what the original
 * command line gave, option by option. */
static void check_sbatch_options(void)
{
    /* A new launch_opts_t field must be rendered by sbatch_script (or be a
     * batch-script one) and compared below; then update this size. */
    _Static_assert(sizeof(launch_opts_t) == 376, "launch_opts_t changed: render the new option "
                                                 "in sbatch.c and compare it here");
    static const char *cases[][58] = {
        { "--sbatch",
          "-g",
          "2",
          "-n",
          "4",
          "--gpus-per-node",
          "4",
          "--device",
          "cuda",
          "--backend",
          "nccl",
          "--timeout",
          "30",
          "--grace",
          "0.1",
          "--max-restarts",
          "3",
          "--log-dir",
          "/tmp/a b's",
          "--tee",
          "--no-label",
          "-v",
          "-v",
          "--metrics-port",
          "9999",
          "--metrics-bind",
          "0.0.0.0",
          "--metrics-per-rank",
          "--metrics-linger",
          "7.5",
          "--metrics-sd-file",
          "/srv/sd/$USER's job.json",
          "--metrics-tls",
          "on",
          "--metrics-cert",
          "/etc/bmt/a cert.pem",
          "--metrics-key",
          "/etc/bmt/key's.pem",
          "--time",
          "02:00:00",
          "--partition",
          "gpu",
          "--account",
          "acct",
          "--job-name",
          "jn",
          "--output",
          "o-%j.out",
          "--signal-lead",
          "300",
          "--",
          "./train",
          "--x",
          "it's",
          "$HOME",
          NULL },
        { "--sbatch", "-n", "2", "--gpus-per-node", "2", "--", "p", NULL },
        { "--sbatch", "-g", "2", "-n", "2", "--nodes", "1", "--metrics-port", "0", "--", "p",
          NULL },
        { "--sbatch", "-g", "2", "-n", "2", "--gpus-per-node", "2", "--backend", "none",
          "--metrics-linger", "0", "--grace", "12.25", "--metrics-tls", "off", "--", "p", "a b",
          NULL },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char *argv[64] = { "bmlaunch", "--template", "templates/bmt.sbatch" };
        int argc = 3;
        for (int i = 0; cases[c][i]; i++)
            argv[argc++] = (char *)cases[c][i];
        argv[argc] = NULL;
        launch_opts_t o1, o2;
        bmt_error_t err = { { 0 } };
        if (cli_parse(argc, argv, &o1, &err) != 0) {
            ok(0, "case %zu parses: %s", c, err.text);
            continue;
        }
        int world = o1.groups * o1.gpus_per_group;
        int gpn = o1.gpus_per_node ? o1.gpus_per_node : world / o1.nodes;
        bmt_layout_t l;
        char *script = bmt_layout_make(&l, o1.groups, o1.gpus_per_group, gpn, o1.nodes, &err) == 0
                           ? sbatch_script(&o1, &l, "/opt/bmt/bin/bmlaunch", &err)
                           : NULL;
        /* The script execs bmlaunch (templates/bmt.sbatch says why): its words
         * follow "exec ". */
        const char *line = script ? strstr(script, "\nexec '/opt/bmt/bin/bmlaunch' ") : NULL;
        if (line == NULL) {
            ok(0, "case %zu renders a bmlaunch line: %s", c, err.text);
            free(script);
            continue;
        }
        static char store[8192];
        char *words[128];
        line += strlen("\nexec");
        int n = split_words(line + 1, store, sizeof(store), words, 128);
        memset(&err, 0, sizeof(err));
        int rc = cli_parse(n, words, &o2, &err);
        ok(rc == 0, "case %zu: the rendered line parses (%s)", c, err.text);
        if (rc != 0) {
            free(script);
            continue;
        }
        const struct {
            bool same;
            const char *what;
        } f[] = {
            { o2.groups == o1.groups, "--groups" },
            { o2.gpus_per_group == o1.gpus_per_group, "--gpus-per-group" },
            { o2.gpus_per_node == l.gpus_per_node, "--gpus-per-node (the layout's)" },
            { o2.nodes == o1.nodes, "--nodes" },
            { same_str(o2.device, o1.device), "--device" },
            { same_str(o2.backend, o1.backend), "--backend" },
            { o2.grace_s == o1.grace_s, "--grace" },
            { o2.timeout_s == o1.timeout_s, "--timeout" },
            { same_str(o2.log_dir, o1.log_dir), "--log-dir" },
            { o2.tee == o1.tee, "--tee" },
            { o2.label == o1.label, "--no-label" },
            { o2.verbose == o1.verbose, "-v" },
            { o2.metrics_port == o1.metrics_port, "--metrics-port" },
            { o2.metrics_port_set == o1.metrics_port_set, "--metrics-port given" },
            { same_str(o2.metrics_bind, o1.metrics_bind), "--metrics-bind" },
            { o2.metrics_bind_set == o1.metrics_bind_set, "--metrics-bind given" },
            { o2.metrics_per_rank == o1.metrics_per_rank, "--metrics-per-rank" },
            { o2.metrics_linger_s == o1.metrics_linger_s, "--metrics-linger" },
            { same_str(o2.metrics_sd_file, o1.metrics_sd_file), "--metrics-sd-file" },
            { o2.metrics_stale_s == o1.metrics_stale_s, "--metrics-stale" },
            { o2.metrics_tls == o1.metrics_tls, "--metrics-tls" },
            { same_str(o2.metrics_cert, o1.metrics_cert), "--metrics-cert" },
            { same_str(o2.metrics_key, o1.metrics_key), "--metrics-key" },
            { o2.max_restarts == o1.max_restarts, "--max-restarts" },
            { !o2.sbatch && !o2.submit && !o2.local && !o2.plan && !o2.time && !o2.partition &&
                  !o2.account && !o2.job_name && !o2.output && !o2.template_path,
              "no batch-script option inside the job" },
            { o2.prog_argc == o1.prog_argc, "the program's argument count" },
        };
        for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
            ok(f[i].same, "case %zu: %s as given", c, f[i].what);
            if (!f[i].same)
                diag("line: %.*s", (int)strcspn(line + 1, "\n"), line + 1);
        }
        for (int i = 0; i < o1.prog_argc && i < o2.prog_argc; i++)
            ok(strcmp(o1.prog_argv[i], o2.prog_argv[i]) == 0, "case %zu: program word %d '%s'", c,
               i, o1.prog_argv[i]);
        free(script);
    }
}

/* --device cpu: the shm backend cannot span nodes; the task count goes with
 * --overcommit (sbatch refuses --ntasks-per-node above a node's CPUs). */
static void check_sbatch_cpu(void)
{
    char *argv[] = { "bmlaunch", "--template", "templates/bmt.sbatch", "--sbatch", "-g", "2",
                     "-n",       "4",          "--gpus-per-node",      "4",        "--", "p",
                     NULL };
    launch_opts_t o;
    bmt_error_t err = { { 0 } };
    bmt_layout_t l;
    ok(cli_parse(12, argv, &o, &err) == 0 && bmt_layout_make(&l, 2, 4, 4, 0, &err) == 0,
       "2 x 4 cpu ranks on nodes of 4 parse");
    char *script = sbatch_script(&o, &l, "/b", &err);
    ok(script == NULL && strstr(err.text, "shm backend, which needs every rank on one node") &&
           strstr(err.text, "spans 2 nodes") && strstr(err.text, "--backend none"),
       "cpu across 2 nodes: refused, with what to do: %s", err.text);
    free(script);
    ok(bmt_layout_make(&l, 2, 4, 8, 0, &err) == 0, "2 x 4 cpu ranks on one node of 8");
    script = sbatch_script(&o, &l, "/b", &err);
    ok(script && strstr(script, "\n#SBATCH --nodes=1\n") &&
           strstr(script, "\n#SBATCH --ntasks=8\n") && strstr(script, "\n#SBATCH --overcommit\n") &&
           !strstr(script, "--ntasks-per-node") && !strstr(script, "--gpus-per-node="),
       "cpu on one node: --ntasks 8 with --overcommit, no --ntasks-per-node");
    free(script);
    o.device = "cuda";
    ok(bmt_layout_make(&l, 2, 4, 4, 0, &err) == 0, "2 x 4 cuda ranks on nodes of 4");
    script = sbatch_script(&o, &l, "/b", &err);
    ok(script && strstr(script, "\n#SBATCH --nodes=2\n") &&
           strstr(script, "\n#SBATCH --ntasks-per-node=4\n") &&
           strstr(script, "\n#SBATCH --gpus-per-node=4\n") && !strstr(script, "--overcommit") &&
           !strstr(script, "--ntasks="),
       "cuda: a task per GPU on each node, no --overcommit");
    free(script);
}

static void check_step(void)
{
    char id[64] = "";
    const char *q = "77.0 other\n77.1 bmlaunch.9.0\n77.3 bmlaunch.9.0x\n77.2 bmlaunch.9.0\n"
                    "77.12 bmlaunch.9.1\n77.batch batch\n";
    ok(slurm_step_find(q, "bmlaunch.9.0", id, sizeof(id)) == 0 && strcmp(id, "77.2") == 0,
       "squeue -s: the newest step of that exact name (77.2, not 77.3 'bmlaunch.9.0x')");
    ok(slurm_step_find(q, "bmlaunch.9.1", id, sizeof(id)) == 0 && strcmp(id, "77.12") == 0,
       "squeue -s: step numbers are numbers (77.12)");
    ok(slurm_step_find(q, "bmlaunch.9.2", id, sizeof(id)) == -1 &&
           slurm_step_find("", "x", id, sizeof(id)) == -1,
       "squeue -s: no step of that name");
    ok(slurm_step_find("77.1 bmlaunch.9.0", "bmlaunch.9.0", id, 3) == -1,
       "an id that does not fit is not cut");

    char out[256];
    char *echo[] = { "sh", "-c", "echo one; echo two >&2; exit 3", NULL };
    int rc = slurm_command(echo, 10, out, sizeof(out));
    ok(rc == 3 && strcmp(out, "one\ntwo") == 0, "a command's exit status, stdout and stderr");
    if (rc != 3)
        diag("rc %d out '%s'", rc, out);
    char *hang[] = { "sleep", "30", NULL };
    rc = slurm_command(hang, 0.3, out, sizeof(out));
    ok(rc == -1 && strstr(out, "sleep did not answer within 0.3 s"),
       "a command past its timeout is "
       "killed: %s",
       out);
    char *none[] = { "/nonexistent/scancel", NULL };
    rc = slurm_command(none, 10, out, sizeof(out));
    ok(rc == 127 && strstr(out, "cannot run /nonexistent/scancel"), "a missing command: 127, %s",
       out);
    char *big[] = { "sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x", NULL };
    char small[16];
    rc = slurm_command(big, 10, small, sizeof(small));
    ok(rc == 0 && strlen(small) == 15, "long output is cut to the buffer, the command still read "
                                       "to its end");
}

/* srun's input variables that would undo bmlaunch's srun command line stay
 * out of srun's environment; the rest of SLURM_* goes through. */
static void check_srun_env(void)
{
    static const char *dropped[] = {
        "SLURM_KILL_BAD_EXIT=1", "SLURM_WAIT=1",           "SLURM_NO_KILL=1",
        "SLURM_UNBUFFEREDIO=1",  "SLURM_STDOUTMODE=o-%t",  "SLURM_STDERRMODE=e",
        "SLURM_STDINMODE=none",  "SLURM_OPEN_MODE=a",      "SLURM_DISABLE_STATUS=1",
        "SLURM_EXIT_ERROR=0",    "SLURM_EXIT_IMMEDIATE=0", "SLURM_WAIT",
    };
    static const char *kept[] = {
        "SLURM_JOB_ID=42",        "SLURM_WAITX=1",   "SLURM_WAI=1",
        "SLURM_CONF=/etc/s.conf", "SLURM_NNODES=2",  "SLURM_TASKS_PER_NODE=4",
        "XSLURM_WAIT=1",          "SLURM_LABELIO=1", "SLURM_EXPORT_ENV=NONE",
    };
    for (size_t i = 0; i < sizeof(dropped) / sizeof(dropped[0]); i++)
        ok(slurm_srun_env_overridden(dropped[i]), "left out of srun's environment: %s", dropped[i]);
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        ok(!slurm_srun_env_overridden(kept[i]), "passed to srun: %s", kept[i]);
}

int main(void)
{
    check_step();
    check_srun_env();
    check_uniform();
    check_detect();
    check_plan();
    check_render();
    check_sbatch_options();
    check_sbatch_cpu();
    return done_testing();
}
