/* launcher/slurm.c — bmlaunch inside a Slurm allocation: plan, srun, rank wrapper.
 *
 * Why every task runs `bmlaunch --rank-exec -- prog`: srun gives all tasks the
 * same environment, but a local run gives each rank its BMT_RANK, BMT_GROUP, ...
 * The wrapper derives them (and torchrun's RANK, LOCAL_RANK, GROUP_RANK,
 * NODE_RANK: torchenv.h) from SLURM_PROCID and the layout, checks that srun
 * put the task on the node the layout says (block distribution), and execs the
 * program: nothing in the rank program differs between local and Slurm runs.
 *
 * srun flags: --mpi=pmix (slurmd is the PMIx server), one task per rank with
 * --ntasks-per-node and --distribution=block (rank r on node r / gpus_per_node),
 * --job-name (the step's name, by which bmlaunch finds it to signal it),
 * --export=ALL (every task gets bmlaunch's environment, whatever
 * SLURM_EXPORT_ENV an `sbatch --export=NONE` left behind), --label
 * (bmlaunch splits the output per rank and joins the pieces of long lines:
 * supervise.c, SRUN_PIECE). Not --unbuffered: it gives each task a pseudo
 * terminal for stdout (a pipe in local mode) and cuts lines wherever a read
 * ends. Not --kill-on-bad-exit:
 * srun would SIGKILL the other tasks at the first failure; bmlaunch reads srun's
 * report of it and ends the step as it ends local ranks (SIGTERM, --grace,
 * SIGKILL), through scancel (slurm_step_signal: srun itself turns SIGINT into a
 * status request and SIGTERM into SIGKILL). GPUs: --gpu-bind=none so
 * every task sees its node's GPUs and takes cuda:<local rank> (binding one GPU
 * per task through cgroups hides the peers and breaks NVLink peer access), and
 * each task gets the node's CPUs split evenly and bound (--cpus-per-task,
 * --cpu-bind=cores). CPU runs may put more tasks than cores on a node
 * (--overcommit, no binding). srun also reads SLURM_WAIT, SLURM_STDOUTMODE, ...
 * from its environment, which would undo some of this without a word: those stay
 * out of it (slurm_srun_env_overridden).
 */
#include "slurm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "torchenv.h"

static const char *real_getenv(const char *name) { return getenv(name); }

int slurm_uniform_count(const char *text, int *out)
{
    /* "4(x2),4,4(x3)": every count equal -> that count; else 0. */
    if (text == NULL || *text == '\0')
        return -1;
    long value = -1;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || errno)
            return -1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x')
                return -1;
            long rep = strtol(p + 2, &end, 10);
            if (end == p + 2 || rep < 1 || *end != ')')
                return -1;
            p = end + 1;
        }
        if (value < 0)
            value = v;
        else if (value != v)
            value = 0;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return -1;
    }
    *out = value > 1 << 20 ? 0 : (int)value;
    return 0;
}

static int get_int(const char *(*get)(const char *), const char *name, int *out, bool required,
                   bmt_error_t *err)
{
    const char *v = get(name);
    if (v == NULL || *v == '\0') {
        if (required)
            return errprintf(err, "inside a Slurm allocation but %s is not set", name);
        *out = 0;
        return 0;
    }
    int n;
    if (bmt_parse_positive(v, name, &n, err) < 0)
        return errprefix(err, "Slurm environment: ");
    *out = n;
    return 0;
}

int slurm_detect_from(slurm_alloc_t *a, const char *(*get)(const char *name), bmt_error_t *err)
{
    const char *job = get("SLURM_JOB_ID");
    if (job == NULL || *job == '\0')
        return 0;
    /* A task of a job step (`srun bmlaunch ...`, as one writes `srun torchrun
     * ...`): the srun that bmlaunch would start asks for CPUs this step holds,
     * and waits for them for ever ("step creation temporarily disabled"), once
     * in every task. The batch script and salloc's shell are no such step; the
     * interactive step (LaunchParameters=use_interactive_step) and the other
     * special steps have ids from 0xfffffff0 up, and srun runs from them. */
    const char *step = get("SLURM_STEP_ID");
    if (step == NULL || *step == '\0')
        step = get("SLURM_STEPID");
    if (step && *step) {
        char *end;
        errno = 0;
        unsigned long long id = strtoull(step, &end, 10);
        if (end != step && *end == '\0' && errno == 0 && id < 0xfffffff0ull)
            return errprintf(err,
                             "bmlaunch runs as a task of job step %.60s.%.60s (srun started "
                             "it), but it starts the ranks with srun itself, whose step would "
                             "wait for this one's CPUs for ever; run bmlaunch in the batch "
                             "script or the salloc shell itself, not under srun, or give "
                             "--local to run the ranks on this node",
                             job, step);
    }
    slurm_alloc_t s = { 0 };
    snprintf(s.job_id, sizeof(s.job_id), "%s", job);
    const char *nn = get("SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES";
    if (get_int(get, nn, &s.nodes, true, err) < 0)
        return -1;
    const char *t = get("SLURM_TASKS_PER_NODE");
    if (t && *t && slurm_uniform_count(t, &s.tasks_per_node) < 0)
        return errprintf(err, "Slurm environment: SLURM_TASKS_PER_NODE='%.200s' is malformed", t);
    const char *c = get("SLURM_JOB_CPUS_PER_NODE");
    if (c && *c && slurm_uniform_count(c, &s.cpus_per_node) < 0)
        return errprintf(err, "Slurm environment: SLURM_JOB_CPUS_PER_NODE='%.200s' is malformed",
                         c);
    if (get_int(get, "SLURM_GPUS_ON_NODE", &s.gpus_per_node, false, err) < 0)
        return -1;
    *a = s;
    return 1;
}

int slurm_detect(slurm_alloc_t *a, bmt_error_t *err)
{
    return slurm_detect_from(a, real_getenv, err);
}

int slurm_plan(const slurm_alloc_t *a, const launch_opts_t *o, bmt_layout_t *l, bmt_error_t *err)
{
    const bool cuda = strcmp(o->device, "cuda") == 0;
    int gpn = o->gpus_per_node;
    bool from_alloc = false; /* gpn is the allocation's GPUs or tasks a node */
    if (gpn == 0 && o->nodes > 0) {
        /* --nodes without --gpus-per-node: the world spread over those nodes
         * (bmt_layout_make), as in local mode, not the allocation's count,
         * which the world may not fill on fewer ranks per node. */
        if (cuda && a->gpus_per_node == 0)
            return errprintf(err,
                             "--device cuda but allocation %s has no GPUs; ask Slurm for them "
                             "(--gpus-per-node) or give --gpus-per-node",
                             a->job_id);
        bmt_layout_t spread;
        if (bmt_layout_make(&spread, o->groups, o->gpus_per_group, 0, o->nodes, err) < 0)
            return -1;
        gpn = spread.gpus_per_node;
    }
    if (gpn == 0) {
        if (cuda && a->gpus_per_node == 0)
            return errprintf(err,
                             "--device cuda but allocation %s has no GPUs; ask Slurm for them "
                             "(--gpus-per-node) or give --gpus-per-node",
                             a->job_id);
        gpn = cuda ? a->gpus_per_node : a->tasks_per_node;
        from_alloc = gpn > 0;
    }
    int world = (long long)o->groups * o->gpus_per_group > BMT_LAYOUT_MAX_WORLD
                    ? 0
                    : o->groups * o->gpus_per_group;
    if (gpn == 0) /* cpu, tasks not uniform or not given: spread over the nodes */
        gpn = world > 0 && world % a->nodes == 0 ? world / a->nodes : 0;
    if (gpn == 0)
        return errprintf(err,
                         "cannot tell the ranks per node of allocation %s (%d nodes); give "
                         "--gpus-per-node",
                         a->job_id, a->nodes);
    if (cuda && a->gpus_per_node > 0 && gpn > a->gpus_per_node && o->gpus_per_node > 0)
        return errprintf(err,
                         "--gpus-per-node %d but the nodes of allocation %s have %d GPUs each; "
                         "give --gpus-per-node %d or less, or ask Slurm for nodes with %d GPUs",
                         gpn, a->job_id, a->gpus_per_node, a->gpus_per_node, gpn);
    if (cuda && a->gpus_per_node > 0 && gpn > a->gpus_per_node)
        return errprintf(err,
                         "--nodes %d puts %d ranks on a node, but the nodes of allocation %s have "
                         "%d GPUs each; ask for more nodes or fewer ranks",
                         o->nodes, gpn, a->job_id, a->gpus_per_node);
    if (bmt_layout_make(l, o->groups, o->gpus_per_group, gpn, o->nodes, err) < 0)
        return from_alloc ? errprefix(err,
                                      "allocation %s has %d %s a node (%s), the ranks a node "
                                      "unless --gpus-per-node says otherwise: ",
                                      a->job_id, gpn, cuda ? "GPUs" : "tasks",
                                      cuda ? "SLURM_GPUS_ON_NODE" : "SLURM_TASKS_PER_NODE")
                          : -1;
    /* srun gives each task a CPU at least (without --overcommit, which GPU
     * ranks do not get: slurm_srun_argv), and refused the step itself, after
     * the plan, with "More processors requested than permitted". */
    if (cuda && a->cpus_per_node > 0 && gpn > a->cpus_per_node)
        return errprintf(err,
                         "%d ranks a node (one task a GPU) need %d CPUs a node, but the nodes of "
                         "allocation %s have %d; ask Slurm for --ntasks-per-node %d (or %d CPUs "
                         "a node), or give fewer ranks a node",
                         gpn, gpn, a->job_id, a->cpus_per_node, gpn, gpn);
    if (l->nodes > a->nodes)
        return errprintf(err,
                         "%d ranks (%d x %d) on nodes of %d need %d nodes, but allocation %s has "
                         "%d; ask for more nodes or fewer ranks",
                         l->world, l->groups, l->gpus_per_group, gpn, l->nodes, a->job_id,
                         a->nodes);
    return 0;
}

static int push(char ***v, int *n, int *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int push(char ***v, int *n, int *cap, const char *fmt, ...)
{
    if (*n + 2 > *cap) {
        int c = *cap ? 2 * *cap : 32;
        char **nv = realloc(*v, (size_t)c * sizeof(char *));
        if (nv == NULL)
            return -1;
        *v = nv;
        *cap = c;
    }
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&(*v)[*n], fmt, ap);
    va_end(ap);
    if (rc < 0)
        return -1;
    (*v)[++*n] = NULL;
    return 0;
}

char **slurm_srun_argv(const slurm_alloc_t *a, const launch_opts_t *o, const bmt_layout_t *l,
                       const char *self, const char *step_name)
{
    char **v = NULL;
    int n = 0, cap = 0, bad = 0;
    const bool cuda = strcmp(o->device, "cuda") == 0;
    bad |= push(&v, &n, &cap, "srun");
    bad |= push(&v, &n, &cap, "--mpi=pmix");
    bad |= push(&v, &n, &cap, "--nodes=%d", l->nodes);
    bad |= push(&v, &n, &cap, "--ntasks=%d", l->world);
    bad |= push(&v, &n, &cap, "--ntasks-per-node=%d", l->gpus_per_node);
    bad |= push(&v, &n, &cap, "--distribution=block");
    bad |= push(&v, &n, &cap, "--job-name=%s", step_name);
    bad |= push(&v, &n, &cap, "--label");
    /* The tasks need bmlaunch's environment (the BMT_ layout, MASTER_ADDR,
     * ...): an allocation made with --export=NONE leaves SLURM_EXPORT_ENV=NONE
     * behind, which srun would otherwise obey. */
    bad |= push(&v, &n, &cap, "--export=ALL");
    if (cuda) {
        bad |= push(&v, &n, &cap, "--gpu-bind=none");
        if (a->cpus_per_node >= l->gpus_per_node) {
            bad |= push(&v, &n, &cap, "--cpus-per-task=%d", a->cpus_per_node / l->gpus_per_node);
            bad |= push(&v, &n, &cap, "--cpu-bind=cores");
        }
    } else if (a->cpus_per_node == 0 || l->gpus_per_node > a->cpus_per_node) {
        /* More CPU ranks than cores: let them share, unbound. */
        bad |= push(&v, &n, &cap, "--overcommit");
        bad |= push(&v, &n, &cap, "--cpu-bind=none");
    }
    bad |= push(&v, &n, &cap, "%s", self);
    bad |= push(&v, &n, &cap, "--rank-exec");
    bad |= push(&v, &n, &cap, "--");
    for (int i = 0; i < o->prog_argc; i++)
        bad |= push(&v, &n, &cap, "%s", o->prog_argv[i]);
    if (bad) {
        slurm_argv_free(v);
        return NULL;
    }
    return v;
}

void slurm_argv_free(char **argv)
{
    if (argv == NULL)
        return;
    for (char **p = argv; *p; p++)
        free(*p);
    free(argv);
}

bool slurm_srun_env_overridden(const char *entry)
{
    static const char *const names[] = {
        "SLURM_KILL_BAD_EXIT",  "SLURM_WAIT",       "SLURM_NO_KILL",        "SLURM_UNBUFFEREDIO",
        "SLURM_STDOUTMODE",     "SLURM_STDERRMODE", "SLURM_STDINMODE",      "SLURM_OPEN_MODE",
        "SLURM_DISABLE_STATUS", "SLURM_EXIT_ERROR", "SLURM_EXIT_IMMEDIATE",
    };
    size_t len = strcspn(entry, "=");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strlen(names[i]) == len && strncmp(names[i], entry, len) == 0)
            return true;
    return false;
}

/* ------------------------------------------------------------ the job step */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int slurm_command(char *const argv[], double timeout_s, char *out, size_t len)
{
    size_t got = 0;
    out[0] = '\0';
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        snprintf(out, len, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(out, len, "fork: %s", strerror(errno));
        close(p[0]), close(p[1]);
        return -1;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(p[1], 1);
        dup2(p[1], 2);
        execvp(argv[0], argv);
        dprintf(2, "cannot run %s: %s", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    const double deadline = mono_s() + timeout_s;
    bool timed_out = false;
    for (;;) {
        double left = deadline - mono_s();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pfd = { .fd = p[0], .events = POLLIN };
        int rc = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            continue;
        char buf[512];
        ssize_t n = read(p[0], buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t take = got + 1 < len ? len - 1 - got : 0;
        if ((size_t)n < take)
            take = (size_t)n;
        memcpy(out + got, buf, take);
        got += take;
        out[got] = '\0';
    }
    close(p[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    while (got > 0 && (out[got - 1] == '\n' || out[got - 1] == ' '))
        out[--got] = '\0';
    if (timed_out) {
        snprintf(out, len, "%s did not answer within %g s", argv[0], timeout_s);
        return -1;
    }
    if (WIFSIGNALED(status)) {
        snprintf(out + got, len - got, "%s%s was killed by signal %d", got ? "; " : "", argv[0],
                 WTERMSIG(status));
        return -1;
    }
    return WEXITSTATUS(status);
}

int slurm_step_find(const char *squeue_out, const char *name, char *id, size_t len)
{
    long best = -1;
    const char *line = squeue_out;
    while (line && *line) {
        const char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        const char *sp = memchr(line, ' ', ll);
        const char *dot = memchr(line, '.', sp ? (size_t)(sp - line) : ll);
        if (sp && dot && ll - (size_t)(sp + 1 - line) == strlen(name) &&
            memcmp(sp + 1, name, strlen(name)) == 0) {
            char *end;
            long step = strtol(dot + 1, &end, 10);
            if (end == sp && step > best && (size_t)(sp - line) < len) {
                best = step;
                snprintf(id, len, "%.*s", (int)(sp - line), line);
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return best >= 0 ? 0 : -1;
}

void slurm_step_init(slurm_step_t *s, const char *job_id, const char *name)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->job_id, sizeof(s->job_id), "%s", job_id);
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->timeout_s = 10;
}

int slurm_step_signal(slurm_step_t *s, int sig, bmt_error_t *err)
{
    char out[4096];
    if (s->id[0] == '\0') {
        char *q[] = { "squeue", "-h", "-s", "-j", s->job_id, "-o", "%i %j", NULL };
        int rc = slurm_command(q, s->timeout_s, out, sizeof(out));
        if (rc != 0)
            return errprintf(err, "squeue -s -j %s: %.1000s", s->job_id,
                             out[0] ? out : "failed with no message");
        if (slurm_step_find(out, s->name, s->id, sizeof(s->id)) < 0)
            return 1;
    }
    char signal[32];
    snprintf(signal, sizeof(signal), "--signal=%d", sig);
    char *c[] = { "scancel", signal, s->id, NULL };
    int rc = slurm_command(c, s->timeout_s, out, sizeof(out));
    if (rc != 0)
        return errprintf(err, "scancel %s %s: %.1000s", signal, s->id,
                         out[0] ? out : "failed with no message");
    return 0;
}

static int env_int(const char *name, int *out)
{
    const char *v = getenv(name);
    bmt_error_t ignored;
    if (v == NULL || bmt_parse_positive(v, name, out, &ignored) < 0)
        return -1;
    return 0;
}

int slurm_rank_exec(int argc, char **argv)
{
    /* argv: the program and its arguments. */
    if (argc < 1) {
        fprintf(stderr, "bmlaunch --rank-exec: no program\n");
        return 2;
    }
    const char *procid = getenv("SLURM_PROCID");
    int rank = -1, groups, gpg, gpn;
    if (procid == NULL || sscanf(procid, "%d", &rank) != 1 || rank < 0 ||
        env_int("BMT_GROUPS", &groups) < 0 || env_int("BMT_GPUS_PER_GROUP", &gpg) < 0 ||
        env_int("BMT_GPUS_PER_NODE", &gpn) < 0) {
        fprintf(stderr, "bmlaunch --rank-exec: needs SLURM_PROCID and the BMT_ layout variables "
                        "(it is started by bmlaunch through srun, not by hand)\n");
        return 2;
    }
    bmt_layout_t l;
    bmt_error_t err;
    if (bmt_layout_make(&l, groups, gpg, gpn, 0, &err) < 0) { /* l is not made: no l.world */
        fprintf(stderr, "bmlaunch --rank-exec: rank %d: layout: %s\n", rank, err.text);
        return 2;
    }
    if (rank >= l.world) {
        fprintf(stderr, "bmlaunch --rank-exec: rank %d: layout: rank outside the world of %d\n",
                rank, l.world);
        return 2;
    }
    bmt_rank_info_t ri = bmt_layout_rank(&l, rank);
    const char *lid = getenv("SLURM_LOCALID"), *nid = getenv("SLURM_NODEID");
    if ((lid && atoi(lid) != ri.local_rank) || (nid && atoi(nid) != ri.node)) {
        fprintf(stderr,
                "bmlaunch --rank-exec: srun placed rank %d on node %s as local rank %s, but the "
                "layout puts it on node %d as local rank %d\n",
                rank, nid ? nid : "?", lid ? lid : "?", ri.node, ri.local_rank);
        return 2;
    }
    char buf[32];
#define SETI(name, value)                                                                          \
    do {                                                                                           \
        snprintf(buf, sizeof(buf), "%d", (value));                                                 \
        setenv((name), buf, 1);                                                                    \
    } while (0)
    SETI("BMT_RANK", rank);
    SETI("BMT_LOCAL_RANK", ri.local_rank);
    SETI("BMT_NODE", ri.node);
    SETI("BMT_GROUP", ri.group);
    SETI("BMT_GROUP_RANK", ri.group_rank);
#undef SETI
    /* torchrun's per-rank variables; bmlaunch put the job's in srun's
     * environment. Rank 0's TCPStore will listen on MASTER_PORT of
     * MASTER_ADDR, which bmlaunch chose without seeing this node: say here,
     * before torch meets it, if that cannot work. A warning, not a failure:
     * programs that do not use torch.distributed need neither. */
    torchenv_setenv_rank(&l, rank);
    const char *maddr = getenv("MASTER_ADDR"), *mport = getenv("MASTER_PORT");
    if (rank == 0 && maddr && *maddr && mport && *mport &&
        torchenv_check_master(maddr, atoi(mport), &err) < 0)
        fprintf(stderr, "bmlaunch: rank 0: %s; torch.distributed's env:// rendezvous will fail\n",
                err.text);
    /* bmlaunch listens on every interface of its node and wrote 0.0.0.0 for
     * its address: srun tells each task the launching node's address. */
    const char *url = getenv("BMT_METRICS_URL"), *launch = getenv("SLURM_LAUNCH_NODE_IPADDR");
    const char *wild = url ? strstr(url, "://0.0.0.0:") : NULL;
    if (wild && launch && *launch) {
        char fixed[1024];
        snprintf(fixed, sizeof(fixed), "%.*s://%s%s", (int)(wild - url), url, launch,
                 wild + strlen("://0.0.0.0"));
        setenv("BMT_METRICS_URL", fixed, 1);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "bmlaunch: rank %d: cannot run '%s': %s\n", rank, argv[0], strerror(errno));
    return 127;
}
