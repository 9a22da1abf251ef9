/* launcher/main.c — bmlaunch: plan a layout, host the ranks, supervise them.
 *
 * Local mode (this file): bmlaunch is the PMIx server of all ranks on this
 * machine (local.c), forks them with the layout in their environment and in the
 * PMIx job keys, and supervises them (supervise.c). Every check that can fail
 * before a rank starts happens first, so bad input changes nothing and exits 2.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <fcntl.h>

#include "bmt/bmt.h"
#include "cli.h"
#include "error.h"
#include "local.h"
#include "plan.h"
#include "supervise.h"

extern char **environ;

static int usage_error(const char *msg)
{
    fprintf(stderr, "bmlaunch: %s\nTry 'bmlaunch --help' for more information.\n", msg);
    return 2;
}

/* GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the driver's
 * list of GPUs. -1 when unknown (no driver here: the ranks will say so). */
static int visible_gpus(void)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v) {
        if (*v == '\0')
            return 0;
        int n = 1;
        for (; *v; v++)
            n += *v == ',';
        return n;
    }
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int mkdir_p(const char *path, bmt_error_t *err)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return errprintf(err, "cannot create --log-dir %.100s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return errprintf(err, "cannot create --log-dir %.100s: %s", buf, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode) || access(buf, W_OK) != 0)
        return errprintf(err, "--log-dir %.100s is not a writable directory", buf);
    return 0;
}

/* The environment of one rank: ours, minus stale BMT_ layout variables, plus
 * this rank's. Returns a NULL-terminated malloc'd array PMIx may extend. */
static char **rank_env(const launch_opts_t *o, const bmt_layout_t *l, int rank, const char *job_id)
{
    static const char *ours[] = { "BMT_GROUPS=",
                                  "BMT_GPUS_PER_GROUP=",
                                  "BMT_GPUS_PER_NODE=",
                                  "BMT_NODES=",
                                  "BMT_WORLD_SIZE=",
                                  "BMT_RANK=",
                                  "BMT_LOCAL_RANK=",
                                  "BMT_GROUP=",
                                  "BMT_GROUP_RANK=",
                                  "BMT_NODE=",
                                  "BMT_JOB_ID=",
                                  "BMT_DEVICE=",
                                  NULL };
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 20, sizeof(char *));
    if (env == NULL)
        return NULL;
    size_t k = 0;
    bool drop_backend = o->backend != NULL, drop_timeout = o->timeout_s > 0;
    for (size_t i = 0; i < n; i++) {
        bool skip = (drop_backend && strncmp(environ[i], "BMT_BACKEND=", 12) == 0) ||
                    (drop_timeout && strncmp(environ[i], "BMT_TIMEOUT=", 12) == 0);
        for (int j = 0; ours[j] && !skip; j++)
            skip = strncmp(environ[i], ours[j], strlen(ours[j])) == 0;
        if (!skip && (env[k] = strdup(environ[i])) != NULL)
            k++;
    }
    bmt_rank_info_t ri = bmt_layout_rank(l, rank);
    char buf[256];
#define ADD(...)                                                                                   \
    do {                                                                                           \
        snprintf(buf, sizeof(buf), __VA_ARGS__);                                                   \
        if ((env[k] = strdup(buf)) != NULL)                                                        \
            k++;                                                                                   \
    } while (0)
    ADD("BMT_GROUPS=%d", l->groups);
    ADD("BMT_GPUS_PER_GROUP=%d", l->gpus_per_group);
    ADD("BMT_GPUS_PER_NODE=%d", l->gpus_per_node);
    ADD("BMT_NODES=%d", l->nodes);
    ADD("BMT_WORLD_SIZE=%d", l->world);
    ADD("BMT_RANK=%d", rank);
    ADD("BMT_LOCAL_RANK=%d", ri.local_rank);
    ADD("BMT_GROUP=%d", ri.group);
    ADD("BMT_GROUP_RANK=%d", ri.group_rank);
    ADD("BMT_NODE=%d", ri.node);
    ADD("BMT_JOB_ID=%s", job_id);
    ADD("BMT_DEVICE=%s", o->device);
    if (o->backend)
        ADD("BMT_BACKEND=%s", o->backend);
    if (o->timeout_s > 0)
        ADD("BMT_TIMEOUT=%g", o->timeout_s);
#undef ADD
    env[k] = NULL;
    return env;
}

static void env_free(char **env)
{
    if (env == NULL)
        return;
    for (char **p = env; *p; p++)
        free(*p);
    free(env);
}

/* Each rank needs two pipes and a PMIx socket; 1000 ranks exceed the usual soft
 * limit of 1024 open files. */
static void raise_nofile(int world)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = (rlim_t)world * 5 + 64;
    if (rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

int main(int argc, char **argv)
{
    launch_opts_t o;
    bmt_error_t err = { { 0 } };
    int rc = cli_parse(argc, argv, &o, &err);
    if (rc == 1)
        return 0;
    if (rc < 0)
        return usage_error(err.text);
    bmt_layout_t l;
    if (bmt_layout_make(&l, o.groups, o.gpus_per_group, o.gpus_per_node, o.nodes, &err) < 0)
        return usage_error(err.text);
    if (o.plan)
        return plan_print(stdout, &l, o.json) == 0 ? 0 : 1;

    /* Local mode: every rank on this machine. PMIx's local ranks are 16-bit. */
    if (l.world > 65535) {
        snprintf(err.text, sizeof(err.text),
                 "local mode hosts at most 65535 ranks on one machine, not %d", l.world);
        return usage_error(err.text);
    }
    if (strcmp(o.device, "cuda") == 0) {
        int gpus = visible_gpus();
        if (l.nodes > 1) {
            snprintf(err.text, sizeof(err.text),
                     "local mode runs every rank on this machine, but the layout has %d nodes of "
                     "%d GPUs; drop --gpus-per-node/--nodes (one node, all its GPUs)",
                     l.nodes, l.gpus_per_node);
            return usage_error(err.text);
        }
        if (gpus >= 0 && l.world > gpus) {
            snprintf(err.text, sizeof(err.text),
                     "%d ranks need %d GPUs but this machine shows %d (CUDA_VISIBLE_DEVICES or "
                     "/proc/driver/nvidia/gpus)",
                     l.world, l.world, gpus);
            return usage_error(err.text);
        }
    }
    char path[PATH_MAX];
    if (resolve_program(o.prog_argv[0], path, sizeof(path), &err) < 0)
        return usage_error(err.text);
    if (o.log_dir && mkdir_p(o.log_dir, &err) < 0)
        return usage_error(err.text);
    raise_nofile(l.world);

    char host[64] = "local";
    gethostname(host, sizeof(host) - 1);
    host[strcspn(host, ".")] = '\0';
    char job_id[128];
    snprintf(job_id, sizeof(job_id), "bmlaunch.%s.%ld.%ld", host, (long)getpid(), (long)time(NULL));

    int notify[2];
    if (pipe2(notify, O_CLOEXEC) != 0) {
        fprintf(stderr, "bmlaunch: pipe: %s\n", strerror(errno));
        return 1;
    }
    /* The supervisor drains the read end until EAGAIN; the PMIx thread's writes
     * stay blocking so that no event is ever dropped. */
    fcntl(notify[0], F_SETFL, O_NONBLOCK);
    job_opts_t jo = {
        .world = l.world,
        .grace_s = o.grace_s,
        .log_dir = o.log_dir,
        .tee = o.tee,
        .label = o.label,
        .verbose = o.verbose,
        .notify_fd = notify[0],
    };
    /* Signals are blocked before PMIx starts its thread, so that thread never
     * takes one of ours. */
    job_t *job = job_create(&jo, &err);
    if (job == NULL) {
        fprintf(stderr, "bmlaunch: %s\n", err.text);
        return 1;
    }
    pmix_host_t *host_srv = NULL;
    if (host_start(&host_srv, job_id, &l, notify[1], &err) < 0) {
        fprintf(stderr, "bmlaunch: cannot start the PMIx server: %s\n", err.text);
        job_destroy(job);
        return 1;
    }
    if (o.verbose)
        fprintf(stderr, "bmlaunch: %d x %d = %d ranks, device %s, PMIx namespace %s\n", l.groups,
                l.gpus_per_group, l.world, o.device, job_id);
    /* Register every rank before the first one starts: PMIx hands a client its
     * job's data when it connects, and that data must already describe every
     * local rank (otherwise early ranks see a smaller PMIX_LOCAL_SIZE). */
    char ***envs = calloc((size_t)l.world, sizeof(char **));
    rc = envs ? 0 : errprintf(&err, "out of memory for %d environments", l.world);
    int failed_rank = 0;
    for (int r = 0; r < l.world && rc == 0; r++) {
        failed_rank = r;
        envs[r] = rank_env(&o, &l, r, job_id);
        if (envs[r] == NULL)
            rc = errprintf(&err, "out of memory building the environment of rank %d", r);
        else
            rc = host_setup_rank(host_srv, r, &envs[r], &err);
    }
    for (int r = 0; r < l.world && rc == 0; r++) {
        failed_rank = r;
        rc = job_spawn(job, r, path, o.prog_argv, envs[r], &err);
    }
    for (int r = 0; envs && r < l.world; r++)
        env_free(envs[r]);
    free(envs);
    if (rc < 0) {
        fprintf(stderr, "bmlaunch: starting rank %d of %d failed: %s\n", failed_rank, l.world,
                err.text);
        job_kill_all(job);
        host_stop(host_srv);
        job_destroy(job);
        return 1;
    }
    int status = job_run(job);
    host_stop(host_srv);
    job_destroy(job);
    close(notify[0]);
    close(notify[1]);
    return status;
}
