/* launcher/supervise.c — spawn the ranks, relay their output, end the job well.
 *
 * One thread, one poll loop. Everything that can happen arrives as a readable
 * file descriptor: signals through a signalfd (they are blocked, so they queue
 * there instead of interrupting anything, also on PMIx's thread), PMIx events
 * through the host's pipe, and each rank's stdout and stderr through a pipe.
 * Because output and exits are handled by the same loop, the summary of a failed
 * rank always includes everything it printed before it died.
 *
 * The job ends when every rank has exited and every pipe reached end of file
 * (or, after all ranks exited, a short drain period passed: a rank may leave a
 * background child holding its pipe). Finally every rank's process group gets
 * SIGKILL, so no rank process outlives bmlaunch. Should bmlaunch itself die
 * (SIGKILL, the OOM killer), PR_SET_PDEATHSIG kills each rank and a guard
 * process kills the rest of each rank's process group (guard_start).
 *
 * bmlaunch's stdout is buffered and its stderr is not: before a line goes to
 * stderr, what stdout holds is written out (console), so that with both on one
 * file (2>&1, sbatch's output file) no line lands inside another.
 *
 * A restart reuses the job: the signalfd stays (unblocking the signals between
 * runs would let a SIGTERM kill bmlaunch there), the per-run state is cleared
 * by job_reset.
 */
#include "supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "local.h"

#define TAIL_LINES 10
#define TAIL_WIDTH 300
#define LINE_MAX_BYTES 65536 /* a longer run without newline is emitted as a line */
#define DRAIN_S 1.0          /* output drain after the last rank exited */

typedef struct stream {
    int fd;      /* -1 once closed */
    bool is_err; /* stderr of the rank */
    char *buf;   /* pending partial line */
    size_t len, cap;
} stream_t;

typedef struct rank_proc {
    int rank;
    pid_t pid; /* also the process group id; 0 if never started */
    bool running;
    int status; /* wait status once exited */
    double start, end;
    stream_t out, err;
    FILE *log;
    int log_errno;          /* the first error writing log (0: none): said in the summary */
    char *tail[TAIL_LINES]; /* ring of the last lines (both streams) */
    int tail_next, tail_count;
} rank_proc_t;

typedef enum failure_kind {
    FAIL_NONE,
    FAIL_EXIT,
    FAIL_SIGNAL,
    FAIL_ABORT
} failure_kind_t;

struct job {
    job_opts_t o;
    rank_proc_t *ranks; /* (world) per rank: the process (local mode), output, tail, log */
    rank_proc_t driver; /* Slurm mode: srun, whose labelled output stands for every rank */
    /* (world) each running rank's pid, else 0: what job_rank_pid reads from
     * another thread (the collector's) while this one spawns and reaps. */
    _Atomic int *live_pid;
    int spawned, running;
    int sigfd;
    int guard_fd;      /* write end of the guard's pipe (guard_start); -1: none (Slurm mode) */
    int console_errno; /* the first error writing the ranks' lines to stdout (0: none) */
    sigset_t old_mask;
    double t0;
    /* The first failure decides the exit status and the summary. */
    failure_kind_t fail;
    int fail_rank, fail_code;
    char fail_msg[BMT_ERROR_TEXT_MAX];
    /* Ending the job. */
    bool ending;
    double kill_at; /* when SIGKILL follows SIGTERM */
    bool killed;
    int interrupts;  /* SIGINTs received: the second one kills at once */
    int user_signal; /* the last SIGINT, SIGTERM or SIGHUP received: the job is stopping */
    /* Bit N: bmlaunch sent signal N to the ranks in this run (forwarded, or its
     * own SIGTERM and SIGKILL). A rank that dies of one of them did not fail:
     * bmlaunch ended it (rank_ended_on). */
    unsigned sent;
    /* A run that signals sent to bmlaunch ended: the signal its exit status and
     * summary name (user_signal, else the SIGUSR1 or SIGUSR2 that a rank died
     * of), set at the first rank that died of bmlaunch's doing; 0: none. */
    int end_signal;
    double signal_at;     /* when bmlaunch last forwarded a signal */
    double stop_at;       /* when the signal that ends the run came (0: none) */
    double fail_at;       /* when the first failure was seen */
    char kill_reason[48]; /* why SIGKILL was sent: "after the 5.0 s grace", ... */
    char lost[96];        /* why bmlaunch gave up supervising and killed the ranks ("") */
    int connected, finalized;
    char host[256];
    char fail_host[128]; /* Slurm mode: the failing task's node, from srun */
    /* Across runs (--max-restarts). */
    int restarts;          /* job_reset calls */
    int stop_signal;       /* SIGINT/SIGTERM/SIGHUP that came after a run (job_restartable) */
    unsigned user_signals; /* bit N: SIGUSR1/SIGUSR2 N came, in any run or between */
};

/* The processes bmlaunch supervises: every rank locally, srun alone under Slurm. */
static int nprocs(const job_t *job)
{
    return job->o.demux ? (job->driver.pid ? 1 : 0) : job->spawned;
}

static rank_proc_t *proc(job_t *job, int i) { return job->o.demux ? &job->driver : &job->ranks[i]; }

static const int handled_signals[] = { SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *sig_name(int sig)
{
    static char buf[16];
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev == NULL) {
        snprintf(buf, sizeof(buf), "%d", sig);
        return buf;
    }
    snprintf(buf, sizeof(buf), "SIG%s", abbrev);
    return buf;
}

/* ------------------------------------------------------------ the guard
 *
 * PR_SET_PDEATHSIG kills a rank when bmlaunch dies, but not what the rank
 * started (the trainer under a wrapper script, data loaders): those outlived a
 * bmlaunch killed by SIGKILL. The guard is a process of its own, a grandchild
 * (bmlaunch's children stay its ranks), in a session of its own (no Ctrl-C of
 * the terminal reaches it) with bmlaunch's signals blocked. It reads each rank's
 * process group from a pipe; at its end of file (bmlaunch gone, however) it
 * sends SIGKILL to every group it knows. A 0 says that bmlaunch swept the
 * groups itself (the end of a run): it forgets them, so that a bmlaunch dying
 * after the run (or in the next) signals no id that may since name another
 * process group. */

static void guard_main(int fd)
{
    pid_t *pg = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        int32_t v;
        ssize_t r = read(fd, &v, sizeof(v)); /* whole records: 4-byte pipe writes are atomic */
        if (r < 0 && errno == EINTR)
            continue;
        if (r != (ssize_t)sizeof(v))
            break;
        if (v <= 0) {
            n = 0;
            continue;
        }
        if (n == cap) {
            size_t c = cap ? 2 * cap : 256;
            pid_t *grown = realloc(pg, c * sizeof(*pg));
            if (grown == NULL)
                continue;
            pg = grown;
            cap = c;
        }
        pg[n++] = (pid_t)v;
    }
    for (size_t i = 0; i < n; i++)
        kill(-pg[i], SIGKILL);
    _exit(0);
}

/* Start the guard; job->guard_fd is the write end of its pipe. Call with the
 * supervisor's signals blocked and before any thread starts. */
static int guard_start(job_t *job, bmt_error_t *err)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return errprintf(err, "the guard process: pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]), close(p[1]);
        return errprintf(err, "the guard process: fork: %s", strerror(e));
    }
    if (pid == 0) {
        close(p[1]);
        if (fork() != 0)
            _exit(0);
        setsid();
        prctl(PR_SET_NAME, "bmlaunch-guard");
        /* Hold none of bmlaunch's files (a console pipe would wait for it). */
        int fd = fcntl(p[0], F_DUPFD, 3), nul = open("/dev/null", O_RDWR);
        for (int i = 0; i < 3 && nul >= 0; i++)
            dup2(nul, i);
        if (fd < 0 || dup2(fd, 3) < 0)
            _exit(1);
        close_range(4, ~0U, 0);
        guard_main(3);
    }
    close(p[0]);
    waitpid(pid, NULL, 0);
    /* A stuck guard must never block the supervisor: a record that does not
     * fit is dropped (the ranks still die with bmlaunch). Room for 65535
     * ranks' records where the system allows it. */
    fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    job->guard_fd = p[1];
    return 0;
}

/* Tell the guard of a rank's process group (pgid), or (0) that every group it
 * knows was swept. */
static void guard_note(job_t *job, pid_t pgid)
{
    int32_t v = (int32_t)pgid;
    if (job->guard_fd >= 0 && write(job->guard_fd, &v, sizeof(v)) != (ssize_t)sizeof(v)) {
        /* a full pipe or a guard gone: see guard_start */
    }
}

job_t *job_create(const job_opts_t *opts, bmt_error_t *err)
{
    job_t *job = calloc(1, sizeof(*job));
    if (job) {
        job->ranks = calloc((size_t)opts->world, sizeof(rank_proc_t));
        job->live_pid = calloc((size_t)opts->world, sizeof(*job->live_pid));
    }
    if (job == NULL || job->ranks == NULL || job->live_pid == NULL) {
        if (job)
            free(job->ranks), free((void *)job->live_pid);
        free(job);
        errprintf(err, "out of memory for %d ranks", opts->world);
        return NULL;
    }
    job->o = *opts;
    job->t0 = now_s();
    job->fail_rank = -1;
    job->guard_fd = -1;
    gethostname(job->host, sizeof(job->host) - 1);
    for (int r = 0; r < opts->world; r++) {
        job->ranks[r].rank = r;
        job->ranks[r].out.fd = job->ranks[r].err.fd = -1;
        job->ranks[r].err.is_err = true;
    }
    job->driver.rank = -1;
    job->driver.out.fd = job->driver.err.fd = -1;
    job->driver.err.is_err = true;
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof(handled_signals) / sizeof(handled_signals[0]); i++)
        sigaddset(&set, handled_signals[i]);
    if (sigprocmask(SIG_BLOCK, &set, &job->old_mask) != 0 ||
        (job->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
        errprintf(err, "signalfd: %s", strerror(errno));
        free(job->ranks);
        free(job);
        return NULL;
    }
    /* Local ranks only: srun (Slurm mode) ends its job step on the SIGTERM of
     * its PR_SET_PDEATHSIG, and a SIGKILL would leave the step running. */
    if (!opts->demux && guard_start(job, err) < 0) {
        close(job->sigfd);
        free(job->ranks);
        free((void *)job->live_pid);
        free(job);
        return NULL;
    }
    /* A closed console must not kill the supervisor before it has ended the job. */
    signal(SIGPIPE, SIG_IGN);
    return job;
}

int resolve_program(const char *name, char *out, size_t len, bmt_error_t *err)
{
    if (strchr(name, '/')) {
        if (access(name, X_OK) != 0)
            return errprintf(err, "cannot run '%.200s': %s", name, strerror(errno));
        struct stat st;
        if (stat(name, &st) == 0 && S_ISDIR(st.st_mode))
            return errprintf(err, "cannot run '%.200s': it is a directory", name);
        snprintf(out, len, "%s", name);
        return 0;
    }
    const char *path = getenv("PATH");
    if (path == NULL || *path == '\0')
        path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    while (*p) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        char cand[PATH_MAX];
        if (n == 0)
            snprintf(cand, sizeof(cand), "./%s", name);
        else
            snprintf(cand, sizeof(cand), "%.*s/%s", (int)n, p, name);
        struct stat st;
        if (access(cand, X_OK) == 0 && stat(cand, &st) == 0 && S_ISREG(st.st_mode)) {
            snprintf(out, len, "%s", cand);
            return 0;
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return errprintf(err, "program '%.200s' not found in PATH", name);
}

/* Open DIR/rank-N.log for rank. */
static int open_log(job_t *job, rank_proc_t *rp, bmt_error_t *err)
{
    char file[PATH_MAX];
    snprintf(file, sizeof(file), "%s/rank-%d.log", job->o.log_dir, rp->rank);
    rp->log = fopen(file, "we");
    if (rp->log == NULL)
        return errprintf(err, "cannot write %.200s: %s", file, strerror(errno));
    return 0;
}

/* Fork and exec one supervised process into rp (a rank, or srun). */
static int spawn(job_t *job, rank_proc_t *rp, const char *path, char *const argv[],
                 char *const envp[], bmt_error_t *err)
{
    const int rank = rp->rank;
    int out[2], errp[2];
    if (pipe2(out, O_CLOEXEC) != 0)
        return errprintf(err, "rank %d: pipe: %s", rank, strerror(errno));
    if (pipe2(errp, O_CLOEXEC) != 0) {
        int e = errno;
        close(out[0]);
        close(out[1]);
        return errprintf(err, "rank %d: pipe: %s (raise the open-files limit, ulimit -n)", rank,
                         strerror(e));
    }
    if (job->o.log_dir && rank >= 0 && rp->log == NULL && open_log(job, rp, err) < 0) {
        close(out[0]), close(out[1]), close(errp[0]), close(errp[1]);
        return -1;
    }
    /* Everything the child needs is prepared here: after fork only
     * async-signal-safe calls are allowed (PMIx runs a thread in this process). */
    char failmsg[512];
    int faillen =
        snprintf(failmsg, sizeof(failmsg), "bmlaunch: rank %d: cannot run '%s': ", rank, path);
    if (faillen < 0 || faillen >= (int)sizeof(failmsg))
        faillen = (int)sizeof(failmsg) - 1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(out[0]), close(out[1]), close(errp[0]), close(errp[1]);
        return errprintf(err, "rank %d: fork: %s", rank, strerror(e));
    }
    if (pid == 0) {
        setpgid(0, 0);
        /* bmlaunch gone (even by SIGKILL): a rank dies with it; srun gets
         * SIGTERM, on which it cancels its job step on every node (a SIGKILLed
         * srun would leave the step and its tasks running). */
        prctl(PR_SET_PDEATHSIG, rp->rank < 0 ? SIGTERM : SIGKILL);
        if (getppid() != parent)
            _exit(127);
        for (size_t i = 0; i < sizeof(handled_signals) / sizeof(handled_signals[0]); i++)
            signal(handled_signals[i], SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        sigprocmask(SIG_SETMASK, &job->old_mask, NULL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0 && devnull != 0) {
            dup2(devnull, 0);
            close(devnull);
        }
        dup2(out[1], 1);
        dup2(errp[1], 2);
        execve(path, argv, envp);
        int e = errno;
        ssize_t w = write(2, failmsg, (size_t)faillen);
        const char *s = strerror(e); /* not listed async-signal-safe, but glibc's is */
        w += write(2, s, strlen(s));
        w += write(2, "\n", 1);
        (void)w;
        _exit(127);
    }
    setpgid(pid, pid); /* also here: no window in which kill(-pid) could miss */
    if (rank >= 0)
        guard_note(job, pid);
    close(out[1]);
    close(errp[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    rp->pid = pid;
    rp->running = true;
    rp->start = now_s();
    rp->out.fd = out[0];
    rp->err.fd = errp[0];
    job->running++;
    return 0;
}

int job_spawn(job_t *job, int rank, const char *path, char *const argv[], char *const envp[],
              bmt_error_t *err)
{
    if (spawn(job, &job->ranks[rank], path, argv, envp, err) < 0)
        return -1;
    atomic_store(&job->live_pid[rank], (int)job->ranks[rank].pid);
    job->spawned++;
    return 0;
}

int job_spawn_driver(job_t *job, const char *path, char *const argv[], char *const envp[],
                     bmt_error_t *err)
{
    if (job->o.log_dir)
        for (int r = 0; r < job->o.world; r++)
            if (job->ranks[r].log == NULL && open_log(job, &job->ranks[r], err) < 0)
                return -1;
    if (spawn(job, &job->driver, path, argv, envp, err) < 0)
        return -1;
    job->spawned = job->o.world;
    return 0;
}

/* ------------------------------------------------------------ output */

static void tail_add(rank_proc_t *rp, const char *line, size_t len)
{
    if (len > TAIL_WIDTH)
        len = TAIL_WIDTH;
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return;
    memcpy(copy, line, len);
    copy[len] = '\0';
    free(rp->tail[rp->tail_next]);
    rp->tail[rp->tail_next] = copy;
    rp->tail_next = (rp->tail_next + 1) % TAIL_LINES;
    if (rp->tail_count < TAIL_LINES)
        rp->tail_count++;
}

static void demux_line(job_t *job, bool is_err, const char *line, size_t len);

/* Write out what rp's --log-dir file holds (Slurm mode, srun: every rank's),
 * as the console is each pass: a log is read while the job runs (tail -f), and
 * a bmlaunch killed by SIGKILL must not lose its last lines, those that say
 * why a job hung. The first error is said in the summary. */
static void log_flush(job_t *job, rank_proc_t *rp)
{
    int lo = rp->rank < 0 ? 0 : rp->rank, hi = rp->rank < 0 ? job->o.world : rp->rank + 1;
    for (int r = lo; r < hi; r++) {
        rank_proc_t *q = &job->ranks[r];
        if (q->log && fflush(q->log) != 0 && q->log_errno == 0)
            q->log_errno = errno ? errno : EIO;
    }
}

/* Write out what stdout holds, noting the first error (job_summary says it). */
static void console_flush(job_t *job)
{
    if (fflush(stdout) != 0 && job->console_errno == 0)
        job->console_errno = errno ? errno : EIO;
}

/* The console stream for a line of a rank's stdout or stderr. stdout is
 * buffered and stderr is not: with both on one file (2>&1, sbatch's one output
 * file) a stderr line would land inside a stdout line that the full buffer had
 * cut, so stdout is written out first. */
static FILE *console(job_t *job, bool is_err)
{
    if (!is_err)
        return stdout;
    console_flush(job);
    return stderr;
}

static void emit_line(job_t *job, rank_proc_t *rp, bool is_err, const char *line, size_t len)
{
    if (rp->rank < 0) { /* srun: the line belongs to a rank, or to srun itself */
        demux_line(job, is_err, line, len);
        return;
    }
    tail_add(rp, line, len);
    if (rp->log && (fwrite(line, 1, len, rp->log) != len || fputc('\n', rp->log) == EOF) &&
        rp->log_errno == 0)
        rp->log_errno = errno ? errno : EIO;
    if (rp->log && !job->o.tee)
        return;
    FILE *con = console(job, is_err);
    if (job->o.label)
        fprintf(con, "%d: ", rp->rank);
    fwrite(line, 1, len, con);
    fputc('\n', con);
    if (!is_err && job->console_errno == 0 && ferror(stdout))
        job->console_errno = errno ? errno : EIO;
}

static void begin_end(job_t *job);
static int stop_signal_of(const job_t *job);
static int rank_ended_on(const job_t *job, int status);

/* The signal whose description (strsignal, as srun prints it) is text. */
static int signal_named(const char *text)
{
    for (int sig = 1; sig < NSIG; sig++) {
        const char *d = strsignal(sig);
        if (d && strcmp(d, text) == 0)
            return sig;
    }
    return 0;
}

/* Each task of srun's list "0-2,5" (span bytes) below the world, as on_exit
 * reports a local rank's end: its wait status and the signal bmlaunch sent
 * that ended it (0: none), and the node srun named. */
static void srun_tasks_exited(job_t *job, const char *list, size_t span, int status, int ended_by,
                              const char *host)
{
    if (job->o.on_exit == NULL)
        return;
    const char *p = list, *end = list + span;
    while (p < end) {
        char *e;
        long a = strtol(p, &e, 10), b = a;
        if (e == p)
            return;
        if (*e == '-') {
            p = e + 1;
            b = strtol(p, &e, 10);
            if (e == p || b < a)
                return;
        }
        for (long r = a; r <= b && r < job->o.world; r++)
            job->o.on_exit(job->o.on_exit_arg, (int)r, status, ended_by, host);
        p = *e == ',' ? e + 1 : end;
    }
}

/* srun's report of a task's end, e.g. "srun: error: node1: task 2: Exited with
 * exit code 3" or "...: task 0: Segmentation fault (core dumped)", or of several
 * that ended alike, "...: tasks 0-2,5: Exited with exit code 1": every task of
 * it goes to on_exit (the collector counts the failed ones, as locally), and
 * the first report names the job's first failure (the lowest task of a list
 * stands for it). */
static void srun_report(job_t *job, const char *line, size_t len)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%.*s", (int)(len < sizeof(buf) - 1 ? len : sizeof(buf) - 1), line);
    const char *t = strstr(buf, ": task "), *list = t ? t + 7 : NULL;
    if (t == NULL && (t = strstr(buf, ": tasks ")) != NULL)
        list = t + 8;
    if (t == NULL || *list < '0' || *list > '9')
        return;
    char *end;
    long rank = strtol(list, &end, 10);
    size_t span = strspn(list, "0123456789-,");
    if (rank >= job->o.world || strncmp(list + span, ": ", 2) != 0)
        return;
    const char *what = list + span + 2;
    const char *h = strstr(buf, "error: ");
    h = h && h < t ? h + 7 : buf;
    char host[sizeof(job->fail_host)];
    snprintf(host, sizeof(host), "%.*s", (int)(t - h), h);
    int code = 0;
    char desc[128];
    snprintf(desc, sizeof(desc), "%s", what);
    char *core = strstr(desc, " (core dumped)");
    if (core)
        *core = '\0';
    /* The tasks' wait status as srun describes it: an exit code, a signal, or
     * something else ("Out Of Memory"), which fails the job with 1. */
    int status = sscanf(what, "Exited with exit code %d", &code) == 1 ? (code & 0xff) << 8
                 : signal_named(desc) > 0                             ? signal_named(desc)
                                                                      : 1 << 8;
    /* As in local mode (rank_exited), also after SIGINT, SIGTERM or SIGHUP: a
     * task that died of a signal bmlaunch sent (or that srun sent for it,
     * signal_ranks) was stopped, one that exited non-zero on its own (its
     * clean-up failed) or died of another signal has failed. */
    const int sig = rank_ended_on(job, status);
    srun_tasks_exited(job, list, span, status, sig, host);
    if (job->fail != FAIL_NONE)
        return;
    snprintf(job->fail_host, sizeof(job->fail_host), "%s", host);
    if (sig > 0) {
        /* A task that died of a signal bmlaunch sent (a forwarded SIGUSR1, say,
         * or the SIGTERM of a stop): a stop, as in local mode (rank_exited). */
        if (job->end_signal == 0) {
            job->end_signal = job->user_signal ? job->user_signal : sig;
            if (job->stop_at == 0)
                job->stop_at = job->signal_at;
            if (!job->ending) {
                fprintf(stderr,
                        "bmlaunch: rank %ld (on %s) %s, a signal bmlaunch forwarded; ending the "
                        "job\n",
                        rank, job->fail_host, what);
                begin_end(job);
            }
        }
        return;
    }
    if (sscanf(what, "Exited with exit code %d", &code) == 1) {
        job->fail = FAIL_EXIT;
        job->fail_code = code;
    } else if ((code = signal_named(desc)) > 0) {
        job->fail = FAIL_SIGNAL;
        job->fail_code = code;
    } else {
        job->fail = FAIL_EXIT;
        job->fail_code = 1;
        snprintf(job->fail_msg, sizeof(job->fail_msg), "%s", what);
    }
    job->fail_rank = (int)rank;
    job->fail_at = now_s();
    const char *ending = job->ending ? "" : "; ending the job";
    if (list + span == end)
        fprintf(stderr, "bmlaunch: rank %ld (on %s) %s%s\n", rank, job->fail_host, what, ending);
    else
        fprintf(stderr, "bmlaunch: ranks %.*s (on %s) %s%s\n", (int)span, list, job->fail_host,
                what, ending);
    begin_end(job);
}

/* Room for `need` bytes of a pending line (doubling from 256); false when out
 * of memory, the buffer unchanged. */
static bool stream_reserve(stream_t *s, size_t need)
{
    if (need <= s->cap)
        return true;
    size_t cap = s->cap ? s->cap : 256;
    while (cap < need)
        cap *= 2;
    char *b = realloc(s->buf, cap);
    if (b == NULL)
        return false;
    s->buf = b;
    s->cap = cap;
    return true;
}

/* srun's pieces. slurmstepd (without --unbuffered) sends a task's output line by
 * line, in messages of at most SRUN_PIECE bytes: a longer line arrives as pieces
 * of exactly SRUN_PIECE bytes and a last piece holding the rest and the newline,
 * and srun --label prints every piece as a line of its own. A line of 1023 bytes
 * and its newline fill one message, so a piece of SRUN_PIECE bytes is always
 * continued. The rank's stream (unused in Slurm mode: the pipes are srun's) holds
 * the pieces until the last one; srun_flush emits what is pending when srun's
 * stream ends. (With --unbuffered tasks write to a pseudo terminal and srun
 * sends whatever one read returned, cutting lines anywhere: hence no -u.) */
#define SRUN_PIECE 1024

static bool piece_add(stream_t *s, const char *p, size_t n)
{
    if (!stream_reserve(s, s->len + n))
        return false;
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    return true;
}

static void srun_flush(job_t *job, bool is_err)
{
    for (int r = 0; r < job->o.world; r++) {
        stream_t *s = is_err ? &job->ranks[r].err : &job->ranks[r].out;
        if (s->len > 0)
            emit_line(job, &job->ranks[r], is_err, s->buf, s->len);
        s->len = 0;
    }
}

/* Slurm mode: "N: text" (srun --label) is rank N's line, or a piece of it
 * (SRUN_PIECE); the rest is srun's. */
static void demux_line(job_t *job, bool is_err, const char *line, size_t len)
{
    size_t i = 0;
    while (i < len && line[i] == ' ')
        i++;
    size_t d = i;
    long r = 0;
    while (i < len && i - d < 9 && line[i] >= '0' && line[i] <= '9')
        r = r * 10 + (line[i++] - '0');
    if (i > d && i < len && line[i] == ':' && r < job->o.world) {
        size_t start = i + 1 < len && line[i + 1] == ' ' ? i + 2 : i + 1;
        rank_proc_t *rp = &job->ranks[r];
        stream_t *s = is_err ? &rp->err : &rp->out;
        const char *p = line + start;
        size_t plen = len - start;
        if (plen == SRUN_PIECE || s->len > 0) {
            if (s->len + plen > LINE_MAX_BYTES) { /* as a local rank's: cut at the limit */
                emit_line(job, rp, is_err, s->buf, s->len);
                s->len = 0;
            }
            if (!piece_add(s, p, plen)) { /* no memory: what is there, then the piece */
                if (s->len > 0)
                    emit_line(job, rp, is_err, s->buf, s->len);
                s->len = 0;
                emit_line(job, rp, is_err, p, plen);
                return;
            }
            if (plen == SRUN_PIECE)
                return;
            p = s->buf;
            plen = s->len;
            s->len = 0;
        }
        emit_line(job, rp, is_err, p, plen);
        /* bmt_abort's line: srun reports the abort only as killed tasks. */
        char text[BMT_ERROR_TEXT_MAX + 100];
        size_t n = plen < sizeof(text) - 1 ? plen : sizeof(text) - 1;
        memcpy(text, p, n);
        text[n] = '\0';
        int status;
        const char *msg = strstr(text, "): ");
        if (job->fail == FAIL_NONE && msg &&
            sscanf(text, "bmt: rank %*d called bmt_abort(status %d)", &status) == 1) {
            job->fail = FAIL_ABORT;
            job->fail_rank = (int)r;
            job->fail_code = status;
            job->fail_at = now_s();
            snprintf(job->fail_msg, sizeof(job->fail_msg), "%s", msg + 3);
            begin_end(job);
        }
        return;
    }
    FILE *con = console(job, true);
    fwrite(line, 1, len, con);
    fputc('\n', con);
    srun_report(job, line, len);
}

static void stream_close(job_t *job, rank_proc_t *rp, stream_t *s)
{
    if (s->fd < 0)
        return;
    if (s->len > 0)
        emit_line(job, rp, s->is_err, s->buf, s->len);
    s->len = 0;
    if (rp->rank < 0)
        srun_flush(job, s->is_err);
    close(s->fd);
    s->fd = -1;
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}

static void stream_read(job_t *job, rank_proc_t *rp, stream_t *s)
{
    char chunk[16384];
    for (;;) {
        ssize_t n = read(s->fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            stream_close(job, rp, s);
            return;
        }
        for (ssize_t i = 0; i < n; i++) {
            char c = chunk[i];
            if (c == '\n' || s->len == LINE_MAX_BYTES) {
                emit_line(job, rp, s->is_err, s->buf, s->len);
                s->len = 0;
                if (c == '\n')
                    continue;
            }
            if (!stream_reserve(s, s->len + 1))
                continue; /* drop a byte rather than the supervisor */
            s->buf[s->len++] = c;
        }
    }
}

/* ------------------------------------------------------------ ending the job */

static void signal_ranks(job_t *job, int sig)
{
    if (sig > 0 && sig < 32)
        job->sent |= 1u << sig;
    if (job->o.signal_step && job->o.demux && job->driver.running &&
        (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGKILL)) {
        bmt_error_t err = { { 0 } };
        int rc = job->o.signal_step(job->o.signal_step_arg, sig, &err);
        if (rc < 0)
            fprintf(stderr,
                    "bmlaunch: signalling the job step through Slurm failed: %s; sending "
                    "%s to srun instead\n",
                    err.text, sig_name(sig));
        else if (rc > 0 && job->o.verbose)
            fprintf(stderr,
                    "bmlaunch: srun's job step is not in squeue (yet); sending %s to srun\n",
                    sig_name(sig));
        if (rc == 0 && sig != SIGKILL)
            return;
    }
    /* srun itself takes SIGTERM and SIGHUP as "SIGKILL every task now": the
     * tasks' deaths by SIGKILL are then bmlaunch's doing, not failures. */
    if (job->o.demux && (sig == SIGTERM || sig == SIGHUP))
        job->sent |= 1u << SIGKILL;
    for (int i = 0; i < nprocs(job); i++)
        if (proc(job, i)->running)
            kill(-proc(job, i)->pid, sig);
}

static void begin_end(job_t *job)
{
    if (job->ending)
        return;
    job->ending = true;
    job->kill_at = now_s() + job->o.grace_s;
    signal_ranks(job, SIGTERM);
}

static void describe_status(char *buf, size_t len, int status)
{
    if (WIFEXITED(status))
        snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "was killed by signal %d (%s)%s", WTERMSIG(status),
                 sig_name(WTERMSIG(status)), WCOREDUMP(status) ? ", core dumped" : "");
    else
        snprintf(buf, len, "ended with wait status %d", status);
}

/* The signal bmlaunch sent that ended a rank of this wait status: it died of
 * one bmlaunch sent in this run (forwarded to it, or bmlaunch's own SIGTERM
 * and SIGKILL), or exited with 128 + that signal (how shells and the JVM end
 * on one). 0: the rank ended by itself. */
static int rank_ended_on(const job_t *job, int status)
{
    int sig = WIFSIGNALED(status)                              ? WTERMSIG(status)
              : WIFEXITED(status) && WEXITSTATUS(status) > 128 ? WEXITSTATUS(status) - 128
                                                               : 0;
    return sig > 0 && sig < 32 && (job->sent >> sig & 1u) ? sig : 0;
}

static void rank_exited(job_t *job, rank_proc_t *rp, int status)
{
    rp->running = false;
    if (rp->rank >= 0 && !job->o.demux)
        atomic_store(&job->live_pid[rp->rank], 0);
    rp->status = status;
    rp->end = now_s();
    job->running--;
    if (job->o.on_exit)
        job->o.on_exit(job->o.on_exit_arg, rp->rank, status, rank_ended_on(job, status), NULL);
    if (rp->rank < 0) {
        /* srun: its task reports named the failure, if there was one. After a
         * stop, srun's failure is the stop's doing (exit_status: 128 + it). */
        bool fine = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (job->fail == FAIL_NONE && !fine && stop_signal_of(job)) {
            if (job->end_signal == 0)
                job->end_signal = stop_signal_of(job);
        } else if (job->fail == FAIL_NONE && !fine) {
            job->fail = WIFSIGNALED(status) ? FAIL_SIGNAL : FAIL_EXIT;
            job->fail_code = WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status);
            job->fail_rank = -1;
            job->fail_at = rp->end;
        }
        return;
    }
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    int ended_on = rank_ended_on(job, status);
    if (job->o.verbose)
        fprintf(stderr, "bmlaunch: rank %d (pid %d) %s%s after %.2f s\n", rp->rank, (int)rp->pid,
                ok         ? "exited 0"
                : ended_on ? "ended on "
                           : "failed",
                ended_on ? sig_name(ended_on) : "", rp->end - rp->start);
    if (ok)
        return;
    if (job->fail != FAIL_NONE)
        return; /* fallout of ending the job, not a new failure (see job_summary) */
    if (ended_on) {
        /* bmlaunch's own doing: a stop, never a rank's failure. The first such
         * death names the run's end; one that the job was not yet ending for
         * (a forwarded SIGUSR1 that the rank did not catch) ends it. */
        if (job->end_signal)
            return;
        job->end_signal = job->user_signal ? job->user_signal : ended_on;
        if (job->stop_at == 0)
            job->stop_at = job->signal_at;
        if (!job->ending) {
            char what[96];
            describe_status(what, sizeof(what), status);
            fprintf(stderr,
                    "bmlaunch: rank %d (pid %d on %s) %s, which bmlaunch forwarded to it, after "
                    "%.2f s; ending the job\n",
                    rp->rank, (int)rp->pid, job->host, what, rp->end - rp->start);
            begin_end(job);
        }
        return;
    }
    job->fail_at = rp->end;
    if (WIFSIGNALED(status)) {
        job->fail = FAIL_SIGNAL;
        job->fail_code = WTERMSIG(status);
    } else {
        job->fail = FAIL_EXIT;
        job->fail_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    job->fail_rank = rp->rank;
    char what[96];
    describe_status(what, sizeof(what), status);
    fprintf(stderr, "bmlaunch: rank %d (pid %d on %s) %s after %.2f s%s\n", rp->rank, (int)rp->pid,
            job->host, what, rp->end - rp->start, job->ending ? "" : "; ending the job");
    begin_end(job);
}

static void reap(job_t *job)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        for (int i = 0; i < nprocs(job); i++)
            if (proc(job, i)->pid == pid && proc(job, i)->running) {
                rank_exited(job, proc(job, i), status);
                break;
            }
    }
}

static void handle_signals(job_t *job)
{
    struct signalfd_siginfo si;
    while (read(job->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            reap(job);
            continue;
        }
        if (job->o.verbose || sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            if (job->o.demux)
                fprintf(stderr,
                        "bmlaunch: received %s; forwarding it to every task of the job "
                        "step\n",
                        sig_name(sig));
            else
                fprintf(stderr, "bmlaunch: received %s; forwarding it to %d rank%s\n",
                        sig_name(sig), job->running, job->running == 1 ? "" : "s");
        }
        if (sig == SIGINT && ++job->interrupts >= 2) {
            fprintf(stderr, "bmlaunch: second SIGINT: killing every rank now\n");
            job->killed = true;
            snprintf(job->kill_reason, sizeof(job->kill_reason), "at the second SIGINT");
            signal_ranks(job, SIGKILL);
            continue;
        }
        if (sig == SIGUSR1 || sig == SIGUSR2)
            job->user_signals |= 1u << sig;
        signal_ranks(job, sig);
        job->signal_at = now_s();
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            job->user_signal = sig;
            if (job->stop_at == 0)
                job->stop_at = job->signal_at;
            if (!job->ending) {
                job->ending = true;
                job->kill_at = now_s() + job->o.grace_s;
            }
        }
    }
}

static void handle_host_events(job_t *job)
{
    host_event_t *ev;
    while (read(job->o.notify_fd, &ev, sizeof(ev)) == (ssize_t)sizeof(ev)) {
        switch (ev->kind) {
        case HOST_CONNECTED: job->connected++; break;
        case HOST_FINALIZED: job->finalized++; break;
        case HOST_ABORT:
            if (job->fail == FAIL_NONE) {
                job->fail = FAIL_ABORT;
                job->fail_rank = ev->rank;
                job->fail_at = now_s();
                job->fail_code = ev->status;
                snprintf(job->fail_msg, sizeof(job->fail_msg), "%s", ev->msg);
                fprintf(stderr,
                        "bmlaunch: rank %d called PMIx_Abort(status %d): %s; ending the job\n",
                        ev->rank, ev->status, ev->msg[0] ? ev->msg : "(no message)");
            }
            begin_end(job);
            if (ev->done)
                ev->done(0 /* PMIX_SUCCESS */, ev->done_data);
            break;
        }
        free(ev);
    }
}

/* The signal sent to bmlaunch that the run ended on (0: none): the last
 * SIGINT, SIGTERM or SIGHUP, else the forwarded signal a rank died of. */
static int stop_signal_of(const job_t *job)
{
    return job->user_signal ? job->user_signal : job->end_signal;
}

int job_failure(const job_t *job, char *buf, size_t len)
{
    if (len > 0)
        buf[0] = '\0';
    if (job->fail == FAIL_NONE || job->fail_rank < 0)
        return -1;
    const rank_proc_t *rp = &job->ranks[job->fail_rank];
    char what[BMT_ERROR_TEXT_MAX + 200];
    if (job->fail == FAIL_ABORT)
        snprintf(what, sizeof(what), "called PMIx_Abort with status %d: %s", job->fail_code,
                 job->fail_msg[0] ? job->fail_msg : "(no message)");
    else if (!job->o.demux)
        describe_status(what, sizeof(what), rp->status);
    else if (job->fail == FAIL_EXIT && job->fail_msg[0])
        snprintf(what, sizeof(what), "%s", job->fail_msg);
    else if (job->fail == FAIL_EXIT)
        snprintf(what, sizeof(what), "exited with code %d", job->fail_code);
    else
        snprintf(what, sizeof(what), "was killed by signal %d (%s)", job->fail_code,
                 sig_name(job->fail_code));
    if (!job->o.demux)
        snprintf(buf, len, "rank %d (pid %d on %s) %s", rp->rank, (int)rp->pid, job->host, what);
    else if (job->fail_host[0])
        snprintf(buf, len, "rank %d (on %s) %s", rp->rank, job->fail_host, what);
    else
        snprintf(buf, len, "rank %d %s", rp->rank, what);
    return 0;
}

int job_aborted(const job_t *job, int *rank, int *status, const char **msg)
{
    if (job->fail != FAIL_ABORT || job->fail_rank < 0)
        return 0;
    *rank = job->fail_rank;
    *status = job->fail_code;
    *msg = job->fail_msg;
    return 1;
}

/* The summary's last line with --max-restarts: how many, and why no more. */
static void summary_restarts(const job_t *job)
{
    bool ended = job->fail != FAIL_NONE || job->end_signal;
    if (job->o.max_restarts == 0 || (!ended && job->restarts == 0))
        return;
    const char *why = "";
    if (!ended)
        ;
    else if (stop_signal_of(job) || job->stop_signal)
        why = "; a job stopped by a signal to bmlaunch is not restarted";
    else if (job->fail_rank < 0)
        why = "; srun itself failed, not a rank: not restarted";
    else if (job->restarts >= job->o.max_restarts)
        why = "; none left";
    fprintf(stderr, "bmlaunch: %d restart%s made (--max-restarts %d)%s\n", job->restarts,
            job->restarts == 1 ? "" : "s", job->o.max_restarts, why);
}

/* Flush every rank's --log-dir file and stdout, and say once, in the summary,
 * if any write failed (a full disk would otherwise truncate the logs or the
 * console's file silently; the exit status stays the job's). */
static void logs_summary(job_t *job)
{
    int bad = 0, first = -1, e = 0;
    for (int r = 0; r < job->o.world; r++) {
        rank_proc_t *rp = &job->ranks[r];
        if (rp->log && fflush(rp->log) != 0 && rp->log_errno == 0)
            rp->log_errno = errno ? errno : EIO;
        if (rp->log_errno) {
            if (first < 0)
                first = r, e = rp->log_errno;
            bad++;
        }
    }
    if (bad)
        fprintf(stderr,
                "bmlaunch: --log-dir %s: the logs of %d rank%s are incomplete: writing rank-%d.log "
                "failed: %s\n",
                job->o.log_dir ? job->o.log_dir : "?", bad, bad == 1 ? "" : "s", first,
                strerror(e));
    console_flush(job);
    if (job->console_errno)
        fprintf(stderr,
                "bmlaunch: standard output: the ranks' output is incomplete: writing it failed: "
                "%s\n",
                strerror(job->console_errno));
}

int supervise_poll_ms(double wait_s)
{
    if (!(wait_s >= 0)) /* negative or nan: no deadline */
        return -1;
    /* At most a minute: the loop wakes and computes the wait again, so a
     * --grace of any length (the CLI takes up to 1e7 s) never overflows int. */
    if (wait_s > 60.0) /* (60 s itself rounds up to 60001, like every wait below it) */
        return 60000;
    return (int)(wait_s * 1000) + 1;
}

/* printf at buf + *len (cap bytes in all), advancing *len; what does not fit
 * is cut. */
__attribute__((format(printf, 4, 5))) static void appendf(char *buf, size_t cap, size_t *len,
                                                          const char *fmt, ...)
{
    if (*len >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len += (size_t)n < cap - *len ? (size_t)n : cap - *len - 1;
}

/* The summary's line on how the ranks other than skip (-1: none) that still
 * ran at time since ended: "of the 3 other ranks still running: 2 ended on
 * SIGTERM, 1 killed with SIGKILL after the 5.0 s grace". A death by a signal
 * bmlaunch sent is named by that signal, whether forwarded or its own. */
static void summary_others(const job_t *job, int skip, double since)
{
    int on[32] = { 0 }, killed = 0, ok = 0, failed = 0, n = 0;
    for (int r = 0; r < job->spawned; r++) {
        const rank_proc_t *o = &job->ranks[r];
        if (r == skip || o->pid == 0 || o->end < since)
            continue;
        int sig = rank_ended_on(job, o->status);
        if (sig == SIGKILL)
            killed++;
        else if (sig)
            on[sig]++;
        else if (WIFEXITED(o->status) && WEXITSTATUS(o->status) == 0)
            ok++;
        else
            failed++;
        n++;
    }
    if (n == 0)
        return;
    char line[512];
    size_t len = 0;
    appendf(line, sizeof(line), &len, "of the %d %srank%s still running: ", n,
            skip >= 0 ? "other " : "", n == 1 ? "" : "s");
    const char *sep = "";
    for (int sig = 1; sig < 32; sig++)
        if (on[sig]) {
            appendf(line, sizeof(line), &len, "%s%d ended on %s", sep, on[sig], sig_name(sig));
            sep = ", ";
        }
    if (killed) {
        appendf(line, sizeof(line), &len, "%s%d killed with SIGKILL %s", sep, killed,
                job->kill_reason);
        sep = ", ";
    }
    if (ok) {
        appendf(line, sizeof(line), &len, "%s%d exited 0", sep, ok);
        sep = ", ";
    }
    if (failed)
        appendf(line, sizeof(line), &len, "%s%d failed on their own", sep, failed);
    fprintf(stderr, "bmlaunch: %s\n", line);
}

void job_summary(job_t *job)
{
    logs_summary(job);
    if (job->lost[0] && job->fail == FAIL_NONE) {
        fprintf(stderr,
                "bmlaunch: job failed: bmlaunch could not go on supervising the ranks (%s) and "
                "killed them\n",
                job->lost);
        return;
    }
    if (job->fail == FAIL_NONE && !job->end_signal) {
        if (job->user_signal)
            fprintf(stderr,
                    "bmlaunch: the job was ended by %s sent to bmlaunch; every rank exited 0\n",
                    sig_name(job->user_signal));
        else if (job->o.verbose || job->restarts > 0)
            fprintf(stderr, "bmlaunch: all %d rank%s exited 0 after %.2f s\n", job->spawned,
                    job->spawned == 1 ? "" : "s", now_s() - job->t0);
        summary_restarts(job);
        return;
    }
    if (job->fail != FAIL_NONE && job->fail_rank < 0) { /* srun failed, no task report said why */
        char what[96];
        describe_status(what, sizeof(what), job->driver.status);
        fprintf(stderr, "bmlaunch: job failed: srun %s\n", what);
        if (stop_signal_of(job))
            fprintf(stderr, "bmlaunch: the job was ended by %s sent to bmlaunch\n",
                    sig_name(stop_signal_of(job)));
        summary_restarts(job);
        return;
    }
    if (job->fail == FAIL_NONE) { /* end_signal: stopped, and no rank failed */
        /* Under srun the tasks' ends are srun's to report (it printed them). */
        fprintf(stderr, "bmlaunch: the job was ended by %s sent to bmlaunch%s\n",
                sig_name(stop_signal_of(job)), job->o.demux ? "" : "; no rank failed");
        summary_others(job, -1, job->stop_at);
        summary_restarts(job);
        return;
    }
    rank_proc_t *rp = &job->ranks[job->fail_rank];
    char what[BMT_ERROR_TEXT_MAX + 400];
    job_failure(job, what, sizeof(what));
    fprintf(stderr, "bmlaunch: job failed: %s\n", what);
    if (rp->tail_count > 0) {
        fprintf(stderr, "bmlaunch: last %d line%s of rank %d:\n", rp->tail_count,
                rp->tail_count == 1 ? "" : "s", rp->rank);
        for (int i = 0; i < rp->tail_count; i++) {
            int k = (rp->tail_next - rp->tail_count + i + TAIL_LINES) % TAIL_LINES;
            fprintf(stderr, "    %d: %s\n", rp->rank, rp->tail[k]);
        }
    } else {
        fprintf(stderr, "bmlaunch: rank %d printed nothing\n", rp->rank);
    }
    /* The others that still ran when the failure came, or the stop before it. */
    double since = job->stop_at > 0 && job->stop_at < job->fail_at ? job->stop_at : job->fail_at;
    summary_others(job, job->fail_rank, since);
    if (stop_signal_of(job) && job->stop_at > job->fail_at)
        fprintf(stderr,
                "bmlaunch: %s sent to bmlaunch after the failure went to the ranks still running\n",
                sig_name(stop_signal_of(job)));
    else if (stop_signal_of(job))
        fprintf(stderr, "bmlaunch: the job was ended by %s sent to bmlaunch\n",
                sig_name(stop_signal_of(job)));
    summary_restarts(job);
}

static int exit_status(const job_t *job)
{
    /* bmlaunch killed the ranks it could no longer watch: it failed itself. */
    if (job->lost[0] && job->fail == FAIL_NONE)
        return 1;
    /* Under srun the tasks that a forwarded SIGTERM ended (by SIGTERM, or by
     * SIGKILL after the grace) make srun fail: report the signal the user sent,
     * as a local run would. Tasks that caught it and exited 0 leave srun's 0. */
    if (job->o.demux && job->fail != FAIL_NONE && job->fail_rank < 0 && job->user_signal)
        return 128 + job->user_signal;
    /* Stopped, and no rank failed: the status of ending on that signal. */
    if (job->fail == FAIL_NONE && job->end_signal)
        return 128 + stop_signal_of(job);
    switch (job->fail) {
    case FAIL_EXIT: return job->fail_code;
    case FAIL_SIGNAL: return 128 + job->fail_code;
    case FAIL_ABORT: return job->fail_code >= 1 && job->fail_code <= 255 ? job->fail_code : 1;
    default: return 0;
    }
}

int job_run(job_t *job)
{
    int nfds_max = 2 + 2 * (nprocs(job) ? nprocs(job) : 1);
    struct pollfd *pfd = calloc((size_t)nfds_max, sizeof(*pfd));
    stream_t **owner = calloc((size_t)nfds_max, sizeof(*owner));
    rank_proc_t **owner_rank = calloc((size_t)nfds_max, sizeof(*owner_rank));
    if (pfd == NULL || owner == NULL || owner_rank == NULL) {
        fprintf(stderr, "bmlaunch: out of memory supervising %d ranks\n", job->spawned);
        job_kill_all(job);
        free(pfd), free(owner), free(owner_rank);
        return 1;
    }
    double drain_until = 0;
    /* A rank may have exited before the loop started. */
    reap(job);
    for (;;) {
        int n = 0;
        pfd[n++] = (struct pollfd){ .fd = job->sigfd, .events = POLLIN };
        if (job->o.notify_fd >= 0)
            pfd[n++] = (struct pollfd){ .fd = job->o.notify_fd, .events = POLLIN };
        int first_stream = n;
        for (int i = 0; i < nprocs(job); i++) {
            rank_proc_t *rp = proc(job, i);
            stream_t *ss[2] = { &rp->out, &rp->err };
            for (int k = 0; k < 2; k++)
                if (ss[k]->fd >= 0) {
                    owner[n] = ss[k];
                    owner_rank[n] = rp;
                    pfd[n++] = (struct pollfd){ .fd = ss[k]->fd, .events = POLLIN };
                }
        }
        int open_streams = n - first_stream;
        if (job->running == 0 && open_streams == 0)
            break;
        double t = now_s();
        if (job->running == 0 && drain_until == 0)
            drain_until = t + DRAIN_S;
        if (job->running == 0 && t >= drain_until) {
            /* Whoever still holds a pipe is a leftover of a rank: end it. */
            for (int i = 0; i < nprocs(job); i++) {
                kill(-proc(job, i)->pid, SIGKILL);
                stream_close(job, proc(job, i), &proc(job, i)->out);
                stream_close(job, proc(job, i), &proc(job, i)->err);
            }
            continue;
        }
        if (job->ending && !job->killed && job->running > 0 && t >= job->kill_at) {
            job->killed = true;
            snprintf(job->kill_reason, sizeof(job->kill_reason), "after the %.1f s grace",
                     job->o.grace_s);
            if (job->o.verbose)
                fprintf(stderr, "bmlaunch: %d rank%s still running after %.1f s grace: SIGKILL\n",
                        job->running, job->running == 1 ? "" : "s", job->o.grace_s);
            signal_ranks(job, SIGKILL);
        }
        double wait = -1;
        if (job->ending && !job->killed && job->running > 0)
            wait = job->kill_at - t;
        if (job->running == 0)
            wait = drain_until - t;
        int tmo = supervise_poll_ms(wait);
        int rc = poll(pfd, (nfds_t)n, tmo);
        if (rc < 0 && errno != EINTR) {
            snprintf(job->lost, sizeof(job->lost), "poll: %s", strerror(errno));
            fprintf(stderr, "bmlaunch: %s; killing every rank\n", job->lost);
            job_kill_all(job);
            break;
        }
        if (rc <= 0)
            continue;
        /* Output first, so a rank's last words precede the news of its death. */
        for (int i = first_stream; i < n; i++)
            if (pfd[i].revents) {
                stream_read(job, owner_rank[i], owner[i]);
                log_flush(job, owner_rank[i]);
            }
        console_flush(job);
        fflush(stderr);
        if (job->o.notify_fd >= 0 && pfd[1].revents)
            handle_host_events(job);
        if (pfd[0].revents)
            handle_signals(job);
    }
    free(pfd);
    free(owner);
    free(owner_rank);
    /* No rank process outlives bmlaunch: sweep every rank's process group. */
    for (int i = 0; i < nprocs(job); i++)
        kill(-proc(job, i)->pid, SIGKILL);
    guard_note(job, 0);
    console_flush(job);
    return exit_status(job);
}

int job_rank_pid(job_t *job, int rank)
{
    if (job == NULL || job->o.demux || rank < 0 || rank >= job->o.world)
        return 0;
    return atomic_load(&job->live_pid[rank]);
}

unsigned job_user_signals(const job_t *job) { return job->user_signals; }

bool job_restartable(job_t *job)
{
    if (job->fail == FAIL_NONE || job->fail_rank < 0 || stop_signal_of(job) || job->lost[0] ||
        job->restarts >= job->o.max_restarts)
        return false;
    /* The loop has ended: a stop that came during the drain or since is read
     * here, not by the next run (which would start every rank only to stop it). */
    struct signalfd_siginfo si;
    while (read(job->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD)
            reap(job);
        else if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)
            job->stop_signal = sig;
        else if (sig == SIGUSR1 || sig == SIGUSR2)
            job->user_signals |= 1u << sig;
    }
    if (job->stop_signal) {
        fprintf(stderr, "bmlaunch: received %s; not restarting the job\n",
                sig_name(job->stop_signal));
        return false;
    }
    return true;
}

/* Close and free what one process's run left: pipes, partial lines, tail. The
 * log file stays (job_destroy closes it). */
static void proc_clear(rank_proc_t *rp)
{
    stream_t *ss[2] = { &rp->out, &rp->err };
    for (int k = 0; k < 2; k++) {
        if (ss[k]->fd >= 0)
            close(ss[k]->fd);
        free(ss[k]->buf);
        ss[k]->fd = -1;
        ss[k]->buf = NULL;
        ss[k]->len = ss[k]->cap = 0;
    }
    for (int i = 0; i < TAIL_LINES; i++) {
        free(rp->tail[i]);
        rp->tail[i] = NULL;
    }
    rp->tail_next = rp->tail_count = 0;
    rp->pid = 0;
    rp->running = false;
    rp->status = 0;
    rp->start = rp->end = 0;
}

void job_reset(job_t *job, int restart)
{
    for (int r = -1; r < job->o.world; r++) {
        rank_proc_t *rp = r < 0 ? &job->driver : &job->ranks[r];
        proc_clear(rp);
        if (r >= 0)
            atomic_store(&job->live_pid[r], 0);
        if (rp->log &&
            (fprintf(rp->log, "bmlaunch: restart %d of %d\n", restart, job->o.max_restarts) < 0 ||
             fflush(rp->log) != 0) &&
            rp->log_errno == 0)
            rp->log_errno = errno ? errno : EIO;
    }
    /* Events of the last run's namespace (an abort that came after its loop
     * ended): release their callers, and let them not count for the next run. */
    host_event_t *ev;
    while (job->o.notify_fd >= 0 &&
           read(job->o.notify_fd, &ev, sizeof(ev)) == (ssize_t)sizeof(ev)) {
        if (ev->kind == HOST_ABORT && ev->done)
            ev->done(0 /* PMIX_SUCCESS */, ev->done_data);
        free(ev);
    }
    job->spawned = job->running = 0;
    job->fail = FAIL_NONE;
    job->fail_rank = -1;
    job->fail_code = 0;
    job->fail_msg[0] = job->kill_reason[0] = job->fail_host[0] = job->lost[0] = '\0';
    job->ending = job->killed = false;
    job->kill_at = job->fail_at = 0;
    job->interrupts = job->user_signal = 0;
    job->sent = 0;
    job->end_signal = 0;
    job->signal_at = job->stop_at = 0;
    job->connected = job->finalized = 0;
    job->restarts = restart;
}

void job_kill_all(job_t *job)
{
    for (int i = 0; i < nprocs(job); i++) {
        rank_proc_t *rp = proc(job, i);
        if (!rp->running)
            continue;
        kill(-rp->pid, SIGKILL);
        waitpid(rp->pid, NULL, 0);
        rp->running = false;
        job->running--;
    }
    guard_note(job, 0);
}

void job_destroy(job_t *job)
{
    if (job == NULL)
        return;
    for (int r = -1; r < job->o.world; r++) {
        rank_proc_t *rp = r < 0 ? &job->driver : &job->ranks[r];
        proc_clear(rp);
        if (rp->log)
            fclose(rp->log);
    }
    /* The signals stay blocked: bmlaunch is ending, and one that came now (the
     * USR1 Slurm sends before the time limit, a late SIGTERM) would otherwise
     * kill it with 128 + that signal in place of the job's status, before it
     * removed its files (--metrics-sd-file). Pending, it goes with the process. */
    close(job->sigfd);
    if (job->guard_fd >= 0)
        close(job->guard_fd);
    free(job->ranks);
    free((void *)job->live_pid);
    free(job);
}
