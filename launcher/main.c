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
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>

#include "bmt/bmt.h"
#include "cli.h"
#include "collector.h"
#include "error.h"
#include "local.h"
#include "costmodel.h"
#include "plan.h"
#include "sbatch.h"
#include "sdfile.h"
#include "slurm.h"
#include "supervise.h"
#include "tlscert.h"
#include "torchenv.h"

extern char **environ;

static int usage_error(const char *msg)
{
    fprintf(stderr, "bmlaunch: %s\nTry 'bmlaunch --help' for more information.\n", msg);
    return 2;
}

/* Entries of a directory other than "." and "..", or -1 when it cannot be read. */
static int dir_entries(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* How many GPUs CUDA_VISIBLE_DEVICES V shows, as CUDA reads it: its entries up
 * to the first that is not a device (an index >= 0, a GPU-/MIG- UUID), so ""
 * and "-1" show none. Entries naming no GPU of this machine are counted: the
 * driver alone knows those (driver_gpus). */
static int cvd_count(const char *v)
{
    int n = 0;
    while (*v) {
        size_t len = strcspn(v, ",");
        bool dev = len > 0 && strspn(v, "0123456789") == len;
        dev |= (len > 4 && strncmp(v, "GPU-", 4) == 0) || (len > 4 && strncmp(v, "MIG-", 4) == 0);
        if (!dev)
            break;
        n++;
        v += len + (v[len] == ',');
    }
    return n;
}

/* GPUs this process may use: none when CUDA_VISIBLE_DEVICES shows none; its
 * count on a machine with an NVIDIA driver; else the driver's list of GPUs.
 * -1 when unknown (no /proc/driver/nvidia: driver_gpus asks libcuda, which
 * reads CUDA_VISIBLE_DEVICES itself, or says there is no driver). */
static int visible_gpus(void)
{
    int all = dir_entries("/proc/driver/nvidia/gpus");
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    int shown = v ? cvd_count(v) : -1;
    return v && (shown == 0 || all >= 0) ? shown : all;
}

/* The GPUs the NVIDIA driver shows this process (CUDA_VISIBLE_DEVICES
 * applies), through libcuda itself: for machines without
 * /proc/driver/nvidia/gpus (some containers). -1 and why when there is no
 * usable driver. */
static int driver_gpus(char *why, size_t len)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        snprintf(why, len,
                 "no NVIDIA driver: libcuda.so.1 cannot be loaded and "
                 "/proc/driver/nvidia/gpus does not exist");
        return -1;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
    int n = 0, rc = init && count ? init(0) : -1;
    if (rc == 0)
        rc = count(&n);
    if (rc != 0) {
        snprintf(why, len,
                 "the NVIDIA driver shows no usable GPU (cuInit/cuDeviceGetCount: CUDA "
                 "driver error %d)",
                 rc);
        return -1; /* libcuda stays loaded: unloading a driver after cuInit is unsafe */
    }
    return n;
}

/* Bad input found after mkdir_p made path: remove what it made (made: the
 * length of path's prefix naming the first directory it made; 0: none), and
 * the metrics-ca.pem written there, so that bad input changes nothing. A
 * directory that was there before stays. */
static void mkdir_p_undo(const char *path, size_t made)
{
    if (made == 0)
        return;
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%.4000s/metrics-ca.pem", path);
    unlink(buf);
    snprintf(buf, sizeof(buf), "%s", path);
    for (size_t n = strlen(buf);;) { /* the deepest first */
        buf[n] = '\0';
        rmdir(buf);
        if (n <= made)
            break;
        while (n > made && buf[n - 1] != '/') /* up to the parent */
            n--;
        while (n > made && buf[n - 1] == '/')
            n--;
    }
}

/* Make the --log-dir path with its parents; *made for mkdir_p_undo. On
 * failure it removes what it made. */
static int mkdir_p(const char *path, size_t *made, bmt_error_t *err)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    *made = 0;
    int rc = 0;
    for (char *p = buf + 1; *p && rc == 0; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int r = mkdir(buf, 0777);
        if (r == 0 && *made == 0)
            *made = strlen(buf);
        else if (r != 0 && errno != EEXIST)
            rc = errprintf(err, "cannot create --log-dir %.200s: %s", buf, strerror(errno));
        *p = '/';
    }
    int r = rc == 0 ? mkdir(buf, 0777) : 0;
    if (rc == 0 && r == 0 && *made == 0)
        *made = strlen(buf);
    else if (r != 0 && errno != EEXIST)
        rc = errprintf(err, "cannot create --log-dir %.200s: %s", buf, strerror(errno));
    struct stat st;
    if (rc == 0 && (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode) || access(buf, W_OK) != 0))
        rc = errprintf(err, "--log-dir %.200s is not a writable directory", buf);
    if (rc < 0)
        mkdir_p_undo(path, *made);
    return rc;
}

/* ------------------------------------------------------------ metrics */

/* What the ranks need to push to the collector (empty when it is off). */
typedef struct metrics_env {
    bool on;
    char url[320];
    char token[80];
    char plugins[1024]; /* BMT_PLUGINS with push in it */
    char plugin_dir[PATH_MAX];
    const char *sd_file;    /* --metrics-sd-file written: remove it in metrics_stop */
    char *ca_pem;           /* HTTPS: the certificate served, BMT_METRICS_CA_PEM (malloc'd) */
    char ca_file[PATH_MAX]; /* its copy beside the sd file: removed in metrics_stop */
} metrics_env_t;

static char *self_path(void);

/* Does the comma-separated list name the push plugin (by name or path)? */
static bool names_push(const char *list)
{
    const char *p = list;
    while (p && *p) {
        size_t n = strcspn(p, ",");
        while (n > 0 && p[n - 1] == ' ')
            n--;
        const char *q = p;
        while (*q == ' ' && q < p + n)
            q++;
        size_t m = n - (size_t)(q - p);
        if ((m == 4 && strncmp(q, "push", 4) == 0) ||
            (m >= 8 && strncmp(q + m - 8, "/push.so", 8) == 0))
            return true;
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return false;
}

/* Where the ranks look up plugins by name: BMT_PLUGIN_DIR when the user set it,
 * else lib/bmt/plugins next to this bmlaunch's bin/ (build/bin ->
 * build/lib/bmt/plugins, PREFIX/bin -> PREFIX/lib/bmt/plugins). Set with and
 * without the collector, so that BMT_PLUGINS=jsonl works from the build tree. */
static void plugin_dir_for_ranks(char *dir, size_t len)
{
    const char *env = getenv("BMT_PLUGIN_DIR");
    const char *self = self_path();
    dir[0] = '\0';
    if (env && *env)
        snprintf(dir, len, "%s", env);
    else if (self) {
        char buf[PATH_MAX];
        snprintf(buf, sizeof(buf), "%s", self);
        char *slash = strrchr(buf, '/');
        if (slash)
            *slash = '\0';
        snprintf(dir, len, "%.3000s/../lib/bmt/plugins", buf);
    }
}

/* Start the collector (unless --metrics-port 0) and fill what the ranks need.
 * host_for_ranks: the address ranks use when bind is a wildcard ("0.0.0.0" is
 * replaced under srun by bmlaunch --rank-exec; see slurm.c). */
/* collector_opts_t.proc_state: a local rank's process state from
 * /proc/PID/stat ("S (sleeping)"); -1 under Slurm or once it exited. */
static int rank_proc_state(void *arg, int rank, char *buf, size_t len)
{
    int pid = job_rank_pid(arg, rank);
    if (pid <= 0)
        return -1;
    char path[64], stat[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, stat, sizeof(stat) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    stat[n] = '\0';
    const char *paren = strrchr(stat, ')'); /* the name may hold spaces and ')' */
    if (paren == NULL || paren[1] != ' ' || paren[2] == '\0')
        return -1;
    static const char *const names[][2] = {
        { "R", "running" },      { "S", "sleeping" }, { "D", "disk sleep" }, { "T", "stopped" },
        { "t", "tracing stop" }, { "Z", "zombie" },   { "X", "dead" },       { "I", "idle" },
    };
    const char *word = "?";
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (paren[2] == names[i][0][0])
            word = names[i][1];
    snprintf(buf, len, "%c (%s)", paren[2], word);
    return 0;
}

static void metrics_stop(collector_t *c, metrics_env_t *me);

/* HTTPS for the collector (--metrics-tls, --metrics-cert): the operator's
 * certificate, or one made for this job whose key never leaves bmlaunch. tc
 * stays empty for plain HTTP. */
static int metrics_tls_cert(const launch_opts_t *o, const char *bind, tlscert_t *tc,
                            bmt_error_t *err)
{
    *tc = (tlscert_t){ 0 };
    if (!o->metrics_cert && !tlscert_wanted((tls_mode_t)o->metrics_tls, bind))
        return 0;
    if (!collector_tls_supported())
        return errprintf(err,
                         "the metrics endpoint on %.100s must serve HTTPS (--metrics-tls), "
                         "but this libmicrohttpd was built without TLS; --metrics-tls off "
                         "serves plain HTTP (the push token then crosses the network in "
                         "clear text)",
                         bind);
    if (o->metrics_cert)
        return tlscert_load(tc, o->metrics_cert, o->metrics_key, err);
    return tlscert_generate_for_host(tc, err);
}

/* The certificate served, for Prometheus's tls_config ca_file: DIR/metrics-ca.pem
 * with --log-dir (kept), and beside the --metrics-sd-file (removed at exit). */
static int metrics_ca_files(const launch_opts_t *o, metrics_env_t *me, bmt_error_t *err)
{
    if (me->ca_pem == NULL)
        return 0;
    size_t n = strlen(me->ca_pem);
    if (o->log_dir) {
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%.4000s/metrics-ca.pem", o->log_dir);
        if (sdfile_write_text(path, "--log-dir", me->ca_pem, n, err) < 0)
            return -1;
    }
    if (o->metrics_sd_file) {
        char path[PATH_MAX];
        if (sdfile_ca_path(o->metrics_sd_file, path, sizeof(path)) < 0)
            return errprintf(err, "--metrics-sd-file: the path is too long");
        if (sdfile_write_text(path, "--metrics-sd-file", me->ca_pem, n, err) < 0)
            return -1;
        snprintf(me->ca_file, sizeof(me->ca_file), "%s", path);
    }
    return 0;
}

static collector_t *metrics_start(const launch_opts_t *o, const bmt_layout_t *l, const char *job_id,
                                  const char *bind, const char *host_for_ranks,
                                  const char *host_shown, metrics_env_t *me, job_t *job,
                                  bmt_error_t *err)
{
    memset(me, 0, sizeof(*me));
    plugin_dir_for_ranks(me->plugin_dir, sizeof(me->plugin_dir));
    if (o->metrics_port == 0)
        return NULL;
    collector_opts_t co = {
        .job_id = job_id,
        .layout = l,
        .device = o->device,
        .per_rank = o->metrics_per_rank,
        .verbose = o->verbose,
        .stale_s = o->metrics_stale_s,
        .proc_state = job ? rank_proc_state : NULL,
        .proc_state_arg = job,
    };
    tlscert_t tc = { 0 };
    if (metrics_tls_cert(o, bind, &tc, err) < 0)
        return NULL;
    co.tls_cert_pem = tc.cert_pem;
    co.tls_key_pem = tc.key_pem;
    collector_t *c = collector_create(&co, err);
    me->ca_pem = tc.cert_pem; /* the key stays in the collector alone */
    tc.cert_pem = NULL;
    tlscert_free(&tc);
    if (c == NULL || collector_listen(c, bind, o->metrics_port, !o->metrics_port_set, err) < 0) {
        collector_destroy(c);
        metrics_stop(NULL, me);
        return NULL;
    }
    const char *s = me->ca_pem ? "s" : "";
    bool wildcard = sdfile_unspecified(bind); /* "::0" too, not only "::" */
    const char *host = wildcard ? host_for_ranks : bind;
    bool v6 = strchr(host, ':') != NULL;
    snprintf(me->url, sizeof(me->url), "http%s://%s%s%s:%d/api/push", s, v6 ? "[" : "", host,
             v6 ? "]" : "", collector_port(c));
    snprintf(me->token, sizeof(me->token), "%s", collector_token(c));
    const char *plugins = getenv("BMT_PLUGINS");
    if (plugins && *plugins &&
        (size_t)snprintf(me->plugins, sizeof(me->plugins), "%s%s", plugins,
                         names_push(plugins) ? "" : ",push") >= sizeof(me->plugins)) {
        /* cut short, the ranks would load another list than the one given */
        errprintf(err,
                  "BMT_PLUGINS is %zu bytes, more than the %zu that bmlaunch passes on with "
                  "\",push\" added; name plugins by name (BMT_PLUGIN_DIR) rather than by long "
                  "paths",
                  strlen(plugins), sizeof(me->plugins) - 6);
        collector_destroy(c);
        metrics_stop(NULL, me);
        return NULL;
    }
    if (!(plugins && *plugins))
        snprintf(me->plugins, sizeof(me->plugins), "push");
    me->on = true;
    const char *shown = wildcard ? host_shown : bind;
    if (o->metrics_sd_file) {
        /* sdfile_write names this host for a wildcard bind */
        if (metrics_ca_files(o, me, err) < 0 ||
            sdfile_write(o->metrics_sd_file, bind, collector_port(c), job_id, me->ca_pem != NULL,
                         err) < 0) {
            collector_destroy(c);
            metrics_stop(NULL, me);
            return NULL;
        }
        me->sd_file = o->metrics_sd_file;
    } else if (metrics_ca_files(o, me, err) < 0) {
        collector_destroy(c);
        metrics_stop(NULL, me);
        return NULL;
    }
    fprintf(stderr, "bmlaunch: metrics on http%s://%s%s%s:%d/ (Prometheus: /metrics)\n", s,
            v6 ? "[" : "", shown, v6 ? "]" : "", collector_port(c));
    return c;
}

/* The collector's end: the server stops and the file_sd target file goes, so
 * Prometheus drops the job's target. NULL: no-op. */
static void metrics_stop(collector_t *c, metrics_env_t *me)
{
    collector_destroy(c);
    sdfile_remove(me->sd_file);
    me->sd_file = NULL;
    sdfile_remove(me->ca_file[0] ? me->ca_file : NULL);
    me->ca_file[0] = '\0';
    free(me->ca_pem);
    me->ca_pem = NULL;
}

/* What on_rank_exit reports to: the collector (started after the job) and the
 * job, whose failure names a rank that called PMIx_Abort. */
typedef struct exit_report {
    collector_t **coll;
    job_t *job;
} exit_report_t;

static void on_rank_exit(void *arg, int rank, int status, int ended_by, const char *host)
{
    exit_report_t *x = arg;
    collector_t *c = *x->coll;
    if (rank < 0 || c == NULL)
        return;
    /* A rank that called PMIx_Abort is the cause, and bmlaunch's SIGTERM ends
     * it like the others: name it first, with its status. */
    int fr, code;
    const char *msg;
    if (x->job && job_aborted(x->job, &fr, &code, &msg))
        collector_rank_aborted(c, fr, code, msg[0] ? msg : NULL);
    collector_rank_host(c, rank, host); /* srun's node of the task, if it never pushed */
    collector_rank_exited(c, rank, status, ended_by);
}

/* --max-restarts: say why every rank starts again, and count it in the metrics. */
static void announce_restart(job_t *job, collector_t *coll, int restart, int max)
{
    char why[BMT_ERROR_TEXT_MAX + 400];
    job_failure(job, why, sizeof(why));
    fprintf(stderr, "bmlaunch: restart %d of %d after %s\n", restart, max, why);
    fflush(stderr);
    collector_job_restarted(coll, restart, why);
}

/* A restart after SIGUSR1 or SIGUSR2 reached bmlaunch (Slurm's warning before
 * the time limit, say, forwarded to a run that then failed, or come between
 * runs): the new run's ranks get it too, once they are ready for it, from
 * bmt_init (BMT_PENDING_SIGNALS). Say so. */
static const char *pending_names(unsigned p)
{
    const bool u1 = p & 1u << SIGUSR1, u2 = p & 1u << SIGUSR2;
    return u1 && u2 ? "USR1,USR2" : u1 ? "USR1" : u2 ? "USR2" : NULL;
}

static void pending_say(job_t *job, int restart)
{
    const char *names = pending_names(job_user_signals(job));
    if (names == NULL)
        return;
    const bool both = strchr(names, ',') != NULL;
    fprintf(stderr,
            "bmlaunch: restart %d: %s came before this run; its ranks get %s at bmt_init "
            "(BMT_PENDING_SIGNALS)\n",
            restart,
            both              ? "SIGUSR1 and SIGUSR2"
            : names[3] == '1' ? "SIGUSR1"
                              : "SIGUSR2",
            both ? "them" : "it");
}

/* --metrics-linger: serve a while after the job, so a last scrape sees the end.
 * By default (s < 0) until the first scrape after the end, if something scrapes
 * (collector_linger_auto bounds the wait). The supervisor's signals are still
 * blocked: wait for one of them instead of sleeping, so Ctrl-C ends the wait. */
static void metrics_linger(collector_t *c, double s)
{
    if (c == NULL)
        return;
    bool until_scrape = s < 0;
    if (until_scrape)
        s = collector_linger_auto(c);
    if (s <= 0)
        return;
    if (until_scrape)
        fprintf(stderr,
                "bmlaunch: serving metrics until the next scrape of /metrics, at most %.3g s more "
                "(--metrics-linger)\n",
                s);
    else
        fprintf(stderr, "bmlaunch: serving metrics for %g s more (--metrics-linger)\n", s);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left =
            s - ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9);
        if (left <= 0 || (until_scrape && collector_scraped_after_end(c)))
            return;
        double slice = until_scrape && left > 0.05 ? 0.05 : left; /* poll for the scrape */
        struct timespec ts = { (time_t)slice, (long)((slice - (double)(time_t)slice) * 1e9) };
        if (sigtimedwait(&set, NULL, &ts) >= 0)
            return; /* Ctrl-C, TERM, HUP */
    }
}

/* The environment of one rank: ours, minus stale BMT_ layout variables (and,
 * for srun, the srun settings that would undo its command line: slurm.h), plus
 * this rank's (rank < 0: the job's only, for srun) and the run's BMT_RESTART
 * (0, then 1, 2, ... after each restart), and torchrun's variables for PyTorch
 * programs (te; torchenv.h). Returns a NULL-terminated malloc'd array PMIx may
 * extend. */
static char **rank_env(const launch_opts_t *o, const bmt_layout_t *l, int rank, const char *job_id,
                       int restart, unsigned pending, const metrics_env_t *me, const torchenv_t *te)
{
    static const char *ours[] = {
        "BMT_GROUPS=",     "BMT_GPUS_PER_GROUP=",  "BMT_GPUS_PER_NODE=",
        "BMT_NODES=",      "BMT_WORLD_SIZE=",      "BMT_RANK=",
        "BMT_LOCAL_RANK=", "BMT_GROUP=",           "BMT_GROUP_RANK=",
        "BMT_NODE=",       "BMT_JOB_ID=",          "BMT_DEVICE=",
        "BMT_RESTART=",    "BMT_PENDING_SIGNALS=", NULL,
    };
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 24 + TORCHENV_MAX, sizeof(char *)); /* ours below, and NULL */
    if (env == NULL)
        return NULL;
    size_t k = 0;
    bool drop_backend = o->backend != NULL, drop_timeout = o->timeout_s > 0;
    for (size_t i = 0; i < n; i++) {
        bool skip = (drop_backend && strncmp(environ[i], "BMT_BACKEND=", 12) == 0) ||
                    (drop_timeout && strncmp(environ[i], "BMT_TIMEOUT=", 12) == 0) ||
                    (me->on && (strncmp(environ[i], "BMT_METRICS_URL=", 16) == 0 ||
                                strncmp(environ[i], "BMT_METRICS_TOKEN=", 18) == 0 ||
                                strncmp(environ[i], "BMT_METRICS_CA_PEM=", 19) == 0 ||
                                strncmp(environ[i], "BMT_PLUGINS=", 12) == 0)) ||
                    (me->plugin_dir[0] && strncmp(environ[i], "BMT_PLUGIN_DIR=", 15) == 0);
        for (int j = 0; ours[j] && !skip; j++)
            skip = strncmp(environ[i], ours[j], strlen(ours[j])) == 0;
        skip = skip || torchenv_is_ours(environ[i]); /* a stale RANK must never reach a rank */
        skip = skip || (rank < 0 && slurm_srun_env_overridden(environ[i])); /* srun's own */
        if (!skip && (env[k] = strdup(environ[i])) != NULL)
            k++;
    }
    bmt_rank_info_t ri = bmt_layout_rank(l, rank < 0 ? 0 : rank);
    char buf[1200];
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
    if (rank >= 0) { /* under srun, bmlaunch --rank-exec sets these in each task */
        ADD("BMT_RANK=%d", rank);
        ADD("BMT_LOCAL_RANK=%d", ri.local_rank);
        ADD("BMT_GROUP=%d", ri.group);
        ADD("BMT_GROUP_RANK=%d", ri.group_rank);
        ADD("BMT_NODE=%d", ri.node);
    }
    ADD("BMT_JOB_ID=%s", job_id);
    ADD("BMT_DEVICE=%s", o->device);
    ADD("BMT_RESTART=%d", restart);
    if (pending_names(pending)) /* they came before this run (none before the first) */
        ADD("BMT_PENDING_SIGNALS=%s", pending_names(pending));
    if (o->backend)
        ADD("BMT_BACKEND=%s", o->backend);
    if (o->timeout_s > 0) { /* exactly the value given (%g would round 1234567) */
        char secs[400];
        if (sbatch_seconds(secs, sizeof(secs), o->timeout_s) == 0)
            ADD("BMT_TIMEOUT=%s", secs);
    }
    if (me->on) {
        ADD("BMT_METRICS_URL=%s", me->url);
        ADD("BMT_METRICS_TOKEN=%s", me->token);
        ADD("BMT_PLUGINS=%s", me->plugins);
        if (me->ca_pem && asprintf(&env[k], "BMT_METRICS_CA_PEM=%s", me->ca_pem) > 0)
            k++;
    }
    if (me->plugin_dir[0]) {
        char dir[PATH_MAX + 32];
        snprintf(dir, sizeof(dir), "BMT_PLUGIN_DIR=%s", me->plugin_dir);
        if ((env[k] = strdup(dir)) != NULL)
            k++;
    }
#undef ADD
    k += (size_t)torchenv_add(env + k, te, l, rank);
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

static char *self_path(void)
{
    static char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    return exe;
}

/* Before --plan or --sbatch writes to stdout: a closed pipe (SIGPIPE) or a
 * file-size limit (SIGXFSZ) would otherwise kill bmlaunch without a word (exit
 * 141 or 153) in place of the write error stdout_finish and plan_print say
 * (exit 1). Nothing is executed after it, so no child inherits the SIG_IGN
 * (--submit's sbatch is started without it: submit_script). */
static void stdout_errors_not_signals(void)
{
    struct sigaction ign = { .sa_handler = SIG_IGN };
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, NULL);
    sigaction(SIGXFSZ, &ign, NULL);
}

/* Flush and close stdout after --plan or --sbatch wrote what to it: a full
 * disk, a closed pipe or a file-size limit must not leave a truncated plan or
 * batch script behind an exit status of 0. Returns 0, or 1 with a message. */
static int stdout_finish(const char *what, int write_errno)
{
    int e = write_errno; /* the cause of a write that already failed, if any */
    if (fflush(stdout) != 0 && e == 0)
        e = errno;
    if (ferror(stdout) && e == 0)
        e = EIO;
    if (fclose(stdout) != 0 && e == 0)
        e = errno;
    if (e == 0)
        return 0;
    fprintf(stderr, "bmlaunch: cannot write %s to stdout: %s; what was written is incomplete\n",
            what, strerror(e));
    return 1;
}

/* Hand script to sbatch on its stdin (its answer goes to our stdout) and
 * return sbatch's exit status. An sbatch that exits without reading all of it
 * is said, not a SIGPIPE that kills bmlaunch without a word. */
static int submit_script(const char *script)
{
    FILE *p = popen("sbatch", "w");
    if (p == NULL) {
        fprintf(stderr, "bmlaunch: cannot run sbatch: %s\n", strerror(errno));
        return 1;
    }
    /* Ignored here only, after popen: sbatch itself keeps the default. */
    struct sigaction ign = { .sa_handler = SIG_IGN }, old;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
    const size_t len = strlen(script);
    int e = 0;
    errno = 0;
    if (fwrite(script, 1, len, p) != len || fflush(p) != 0)
        e = errno ? errno : EIO;
    int st = pclose(p);
    sigaction(SIGPIPE, &old, NULL);
    int rc = st == -1 ? 1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (e) {
        fprintf(stderr,
                "bmlaunch: sbatch did not read the whole batch script (%s) and exited with "
                "status %d; nothing was submitted unless sbatch says so\n",
                strerror(e), rc);
        return rc ? rc : 1;
    }
    return rc;
}

/* --sbatch [--submit]: print (or submit) the batch script of this job. */
static int run_sbatch(const launch_opts_t *o)
{
    bmt_error_t err = { { 0 } };
    if (o->gpus_per_node == 0 && o->nodes == 0)
        return usage_error("--sbatch needs --gpus-per-node (ranks per node) or --nodes to size "
                           "the job");
    bmt_layout_t l; /* ranks per node from --nodes as --plan has them (bmt_layout_make) */
    if (bmt_layout_make(&l, o->groups, o->gpus_per_group, o->gpus_per_node, o->nodes, &err) < 0)
        return usage_error(err.text);
    const char *self = self_path();
    if (self == NULL)
        return usage_error("cannot find bmlaunch's own path (/proc/self/exe)");
    char *script = sbatch_script(o, &l, self, &err);
    if (script == NULL)
        return usage_error(err.text);
    if (!o->submit) {
        stdout_errors_not_signals();
        errno = 0;
        const int werr = fputs(script, stdout) == EOF ? errno : 0;
        free(script);
        return stdout_finish("the batch script", werr);
    }
    char sbatch[PATH_MAX];
    if (resolve_program("sbatch", sbatch, sizeof(sbatch), &err) < 0) {
        free(script);
        return usage_error("--submit needs sbatch in PATH (Slurm's client commands)");
    }
    int rc = submit_script(script);
    free(script);
    return rc;
}

/* job_opts_t.signal_step under Slurm: through scancel, not srun (slurm.h). */
static int signal_step(void *arg, int sig, bmt_error_t *err)
{
    return slurm_step_signal(arg, sig, err);
}

/* Inside a Slurm allocation: srun starts the ranks; bmlaunch supervises srun. */
static int run_slurm(const launch_opts_t *o, const slurm_alloc_t *a)
{
    bmt_error_t err = { { 0 } };
    bmt_layout_t l;
    if (slurm_plan(a, o, &l, &err) < 0)
        return usage_error(err.text);
    char srun[PATH_MAX], path[PATH_MAX];
    if (resolve_program("srun", srun, sizeof(srun), &err) < 0)
        return usage_error("inside a Slurm allocation bmlaunch starts the ranks with srun, which "
                           "is not in PATH; install Slurm's client commands or use --local");
    if (resolve_program(o->prog_argv[0], path, sizeof(path), &err) < 0)
        return usage_error(err.text);
    /* --log-dir logs-%j: one directory per job (the batch script's natural use). */
    launch_opts_t oo = *o;
    char log_dir[PATH_MAX];
    if (o->log_dir && strstr(o->log_dir, "%j")) {
        size_t k = 0;
        for (const char *p = o->log_dir; *p && k + 64 < sizeof(log_dir); p++) {
            if (p[0] == '%' && p[1] == 'j') {
                k += (size_t)snprintf(log_dir + k, sizeof(log_dir) - k, "%s", a->job_id);
                p++;
            } else
                log_dir[k++] = *p;
        }
        log_dir[k] = '\0';
        oo.log_dir = log_dir;
    }
    o = &oo;
    size_t made = 0;
    if (o->log_dir && mkdir_p(o->log_dir, &made, &err) < 0)
        return usage_error(err.text);
    const char *self = self_path();
    if (self == NULL) {
        mkdir_p_undo(o->log_dir, made);
        return usage_error("cannot find bmlaunch's own path (/proc/self/exe)");
    }
    char job_id[128];
    snprintf(job_id, sizeof(job_id), "slurm.%s", a->job_id);
    /* Ranks on other nodes cannot reach a loopback address: with several nodes
     * the default bind becomes every interface (pushes still need the token),
     * and bmlaunch --rank-exec points each rank at this node's address. */
    const char *bind = o->metrics_bind;
    if (!o->metrics_bind_set && l.nodes > 1)
        bind = "0.0.0.0";
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    metrics_env_t me = { 0 };
    collector_t *coll = NULL;
    exit_report_t exits = { &coll, NULL }; /* srun's reports of the tasks' ends */
    slurm_step_t step;
    slurm_step_init(&step, a->job_id, "");
    job_opts_t jo = {
        .world = l.world,
        .grace_s = o->grace_s,
        .log_dir = o->log_dir,
        .tee = o->tee,
        .label = o->label,
        .verbose = o->verbose,
        .notify_fd = -1,
        .demux = true,
        .max_restarts = o->max_restarts,
        .on_exit = on_rank_exit,
        .on_exit_arg = &exits,
        .signal_step = signal_step,
        .signal_step_arg = &step,
    };
    job_t *job = job_create(&jo, &err);
    if (job == NULL) {
        fprintf(stderr, "bmlaunch: %s\n", err.text);
        return 1;
    }
    exits.job = job;
    /* After job_create: the collector's threads inherit the blocked signals. */
    coll = metrics_start(o, &l, job_id, bind, "0.0.0.0", host, &me, NULL, &err);
    if (coll == NULL && o->metrics_port != 0) {
        job_destroy(job);
        mkdir_p_undo(o->log_dir, made);
        return usage_error(err.text);
    }
    /* torch's MASTER_ADDR: rank 0's node as Slurm reaches it (torchenv.h). */
    torchenv_t te = { .max_restarts = o->max_restarts, .run_id = job_id };
    const char *nodelist = getenv("SLURM_JOB_NODELIST");
    if (nodelist == NULL || *nodelist == '\0')
        nodelist = getenv("SLURM_NODELIST");
    if (nodelist == NULL ||
        torchenv_slurm_master_addr(nodelist, te.master_addr, sizeof(te.master_addr), &err) < 0)
        fprintf(stderr, "bmlaunch: MASTER_ADDR for torch.distributed is not set: %s\n",
                nodelist ? err.text : "SLURM_JOB_NODELIST is not set");
    /* One srun (one job step) per run; a restart is the next step of the same
     * allocation, with BMT_RESTART in the tasks' environment (srun passes ours).
     * Each step has a name of its own, by which signals find it (scancel). */
    int status = 1;
    char **argv = NULL;
    for (int restart = 0;; restart++) {
        if (restart > 0) {
            announce_restart(job, coll, restart, o->max_restarts);
            job_reset(job, restart);
        }
        char step_name[96];
        snprintf(step_name, sizeof(step_name), "bmlaunch.%d.%d", (int)getpid(), restart);
        slurm_step_init(&step, a->job_id, step_name);
        slurm_argv_free(argv);
        argv = slurm_srun_argv(a, o, &l, self, step_name);
        if (argv == NULL) {
            fprintf(stderr, "bmlaunch: out of memory\n");
            status = 1;
            break;
        }
        if (o->verbose) {
            fprintf(stderr,
                    "bmlaunch: allocation %s: %d x %d = %d ranks on %d of %d nodes:", a->job_id,
                    l.groups, l.gpus_per_group, l.world, l.nodes, a->nodes);
            for (char **p = argv; *p; p++)
                fprintf(stderr, " %s", *p);
            fputc('\n', stderr);
        }
        te.restart = restart;
        te.master_port = torchenv_port_for(a->job_id, (long)getpid(), restart);
        pending_say(job, restart);
        char **env = rank_env(o, &l, -1, job_id, restart, job_user_signals(job), &me, &te);
        int rc = env ? job_spawn_driver(job, srun, argv, env, &err)
                     : errprintf(&err, "out of memory for the environment of srun");
        env_free(env);
        if (rc < 0) {
            fprintf(stderr, "bmlaunch: starting srun failed: %s\n", err.text);
            status = 1;
            break;
        }
        status = job_run(job);
        if (!job_restartable(job)) {
            job_summary(job);
            break;
        }
    }
    collector_job_ended(coll, status);
    metrics_linger(coll, o->metrics_linger_s);
    job_destroy(job);
    metrics_stop(coll, &me);
    slurm_argv_free(argv);
    return status;
}

/* Register every rank of one run (restart: 0, 1, ...) with the PMIx server,
 * then fork them all. On failure *failed_rank names the rank. */
static int start_ranks(job_t *job, pmix_host_t *srv, const launch_opts_t *o, const bmt_layout_t *l,
                       const char *path, const char *job_id, int restart, const metrics_env_t *me,
                       const torchenv_t *te, int *failed_rank, bmt_error_t *err)
{
    /* Register every rank before the first one starts: PMIx hands a client its
     * job's data when it connects, and that data must already describe every
     * local rank (otherwise early ranks see a smaller PMIX_LOCAL_SIZE). */
    char ***envs = calloc((size_t)l->world, sizeof(char **));
    int rc = envs ? 0 : errprintf(err, "out of memory for %d environments", l->world);
    for (int r = 0; r < l->world && rc == 0; r++) {
        *failed_rank = r;
        envs[r] = rank_env(o, l, r, job_id, restart, job_user_signals(job), me, te);
        if (envs[r] == NULL)
            rc = errprintf(err, "out of memory building the environment of rank %d", r);
        else
            rc = host_setup_rank(srv, r, &envs[r], err);
    }
    for (int r = 0; r < l->world && rc == 0; r++) {
        *failed_rank = r;
        rc = job_spawn(job, r, path, o->prog_argv, envs[r], err);
    }
    for (int r = 0; envs && r < l->world; r++)
        env_free(envs[r]);
    free(envs);
    return rc;
}

/* Open file descriptors of bmlaunch (-v, at each restart: they must not grow). */
static int open_fds(void)
{
    int n = dir_entries("/proc/self/fd");
    return n < 0 ? -1 : n - 1; /* the directory's own */
}

/* On this machine: bmlaunch is the PMIx server of every rank. */
static int run_local(const launch_opts_t *o_, const bmt_layout_t *l_)
{
    const launch_opts_t o = *o_;
    const bmt_layout_t l = *l_;
    bmt_error_t err = { { 0 } };
    /* Local mode: every rank on this machine. PMIx's local ranks are 16-bit. */
    if (l.world > 65535) {
        snprintf(err.text, sizeof(err.text),
                 "local mode hosts at most 65535 ranks on one machine, not %d", l.world);
        return usage_error(err.text);
    }
    if (strcmp(o.device, "cuda") == 0) {
        if (l.nodes > 1) {
            snprintf(err.text, sizeof(err.text),
                     "local mode runs every rank on this machine, but the layout has %d nodes of "
                     "%d GPUs; drop --gpus-per-node/--nodes (one node, all its GPUs)",
                     l.nodes, l.gpus_per_node);
            return usage_error(err.text);
        }
        int gpus = visible_gpus();
        char why[200];
        if (gpus < 0 && (gpus = driver_gpus(why, sizeof(why))) < 0) {
            snprintf(err.text, sizeof(err.text),
                     "--device cuda, but %s; run on a machine with NVIDIA GPUs and their driver, "
                     "or use --device cpu",
                     why);
            return usage_error(err.text);
        }
        if (gpus == 0) {
            snprintf(err.text, sizeof(err.text),
                     "--device cuda, but this machine shows no GPU (CUDA_VISIBLE_DEVICES, "
                     "/proc/driver/nvidia/gpus or the driver); use --device cpu");
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
    size_t made = 0;
    if (o.log_dir && mkdir_p(o.log_dir, &made, &err) < 0)
        return usage_error(err.text);
    raise_nofile(l.world);

    char host[64] = "local";
    gethostname(host, sizeof(host) - 1);
    host[strcspn(host, ".")] = '\0';
    char job_id[128];
    snprintf(job_id, sizeof(job_id), "bmlaunch.%s.%ld.%ld", host, (long)getpid(), (long)time(NULL));

    collector_t *coll = NULL; /* started once the job blocked its signals (see below) */
    metrics_env_t me = { 0 };
    exit_report_t exits = { &coll, NULL };

    int notify[2];
    if (pipe2(notify, O_CLOEXEC) != 0) {
        fprintf(stderr, "bmlaunch: pipe: %s\n", strerror(errno));
        metrics_stop(coll, &me);
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
        .max_restarts = o.max_restarts,
        .on_exit = on_rank_exit,
        .on_exit_arg = &exits,
    };
    /* Signals are blocked before PMIx starts its thread, so that thread never
     * takes one of ours. */
    job_t *job = job_create(&jo, &err);
    if (job == NULL) {
        fprintf(stderr, "bmlaunch: %s\n", err.text);
        return 1;
    }
    exits.job = job;
    /* The collector's threads must inherit the blocked signals, or SIGCHLD could
     * land on one of them and never reach the supervisor. */
    coll = metrics_start(&o, &l, job_id, o.metrics_bind, "127.0.0.1", "127.0.0.1", &me, job, &err);
    if (coll == NULL && o.metrics_port != 0) {
        job_destroy(job);
        mkdir_p_undo(o.log_dir, made);
        return usage_error(err.text);
    }
    pmix_host_t *host_srv = NULL;
    if (host_start(&host_srv, job_id, &l, notify[1], &err) < 0) {
        fprintf(stderr, "bmlaunch: cannot start the PMIx server: %s\n", err.text);
        job_destroy(job);
        metrics_stop(coll, &me);
        return 1;
    }
    if (o.verbose)
        fprintf(stderr, "bmlaunch: %d x %d = %d ranks, device %s, PMIx namespace %s\n", l.groups,
                l.gpus_per_group, l.world, o.device, job_id);
    int status = 1;
    for (int restart = 0;; restart++) {
        if (restart > 0) {
            /* A fresh namespace per run: nothing of the last run's PMIx state,
             * nor the shm segments libbmt names after the namespace, carries
             * over. BMT_JOB_ID (the collector's job) stays. */
            char nspace[192];
            snprintf(nspace, sizeof(nspace), "%s.restart%d", job_id, restart);
            announce_restart(job, coll, restart, o.max_restarts);
            if (host_renew(host_srv, nspace, &err) < 0) {
                fprintf(stderr, "bmlaunch: cannot restart the job: %s\n", err.text);
                job_summary(job);
                break;
            }
            job_reset(job, restart);
            if (o.verbose)
                fprintf(stderr, "bmlaunch: restart %d: PMIx namespace %s, %d open files\n", restart,
                        nspace, open_fds());
        }
        /* torch's MASTER_PORT: a fresh free port per run, held until it ends. */
        torchenv_t te = { .master_addr = "127.0.0.1",
                          .restart = restart,
                          .max_restarts = o.max_restarts,
                          .run_id = job_id };
        int port_fd = -1;
        te.master_port = torchenv_port_reserve(&port_fd, &err);
        int failed_rank = 0;
        pending_say(job, restart);
        if (te.master_port < 0 || start_ranks(job, host_srv, &o, &l, path, job_id, restart, &me,
                                              &te, &failed_rank, &err) < 0) {
            if (te.master_port < 0)
                fprintf(stderr, "bmlaunch: %s\n", err.text);
            else
                fprintf(stderr, "bmlaunch: starting rank %d of %d failed: %s\n", failed_rank,
                        l.world, err.text);
            if (port_fd >= 0)
                close(port_fd);
            job_kill_all(job);
            host_stop(host_srv);
            job_destroy(job);
            metrics_stop(coll, &me);
            close(notify[0]);
            close(notify[1]);
            return 1;
        }
        status = job_run(job);
        close(port_fd);
        if (!job_restartable(job)) {
            job_summary(job);
            break;
        }
    }
    collector_job_ended(coll, status);
    metrics_linger(coll, o.metrics_linger_s);
    host_stop(host_srv);
    job_destroy(job);
    metrics_stop(coll, &me);
    close(notify[0]);
    close(notify[1]);
    return status;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--rank-exec") == 0) {
        int a = argc >= 3 && strcmp(argv[2], "--") == 0 ? 3 : 2;
        return slurm_rank_exec(argc - a, argv + a);
    }
    launch_opts_t o;
    bmt_error_t err = { { 0 } };
    int rc = cli_parse(argc, argv, &o, &err);
    if (rc == 1)
        return 0;
    if (rc < 0)
        return usage_error(err.text);
    if (o.sbatch)
        return run_sbatch(&o);
    bmt_layout_t l;
    if (o.plan) {
        if (bmt_layout_make(&l, o.groups, o.gpus_per_group, o.gpus_per_node, o.nodes, &err) < 0)
            return usage_error(err.text);
        costmodel_in_t cin;
        costmodel_candidate_t cand[COSTMODEL_CANDIDATES];
        int n = 0;
        if (o.cost.model) {
            n = costmodel_setup(&o.cost, &cin, &err) < 0
                    ? -1
                    : costmodel_rank(&l, &cin, cand, COSTMODEL_CANDIDATES, &err);
            if (n < 0)
                return usage_error(err.text);
        }
        stdout_errors_not_signals();
        if (plan_print(stdout, &l, o.json, o.cost.model ? &cin : NULL, o.cost.model ? cand : NULL,
                       (size_t)n, &err) < 0) {
            fprintf(stderr, "bmlaunch: %s\n", err.text);
            return 1;
        }
        return stdout_finish("the plan", 0);
    }
    slurm_alloc_t a;
    int in_slurm = o.local ? 0 : slurm_detect(&a, &err);
    if (in_slurm < 0)
        return usage_error(err.text);
    if (in_slurm)
        return run_slurm(&o, &a);
    if (bmt_layout_make(&l, o.groups, o.gpus_per_group, o.gpus_per_node, o.nodes, &err) < 0 ||
        host_check_env(&err) < 0)
        return usage_error(err.text);
    rc = run_local(&o, &l);
    if (host_finalize_stuck()) { /* a thread sits in libpmix's lock: no exit-time code */
        fflush(NULL);
        _exit(rc);
    }
    return rc;
}
