/* launcher/supervise.h — the ranks as processes: spawn, watch, relay, end.
 *
 * Supervision as users know it from `srun -K` and torchrun: the first rank that
 * exits non-zero, dies by a signal or calls PMIx_Abort ends the job; the others
 * get SIGTERM, then SIGKILL after the grace period; bmlaunch exits with that
 * rank's status and prints a summary naming it. Signals sent to bmlaunch are
 * forwarded to every rank. A rank that dies of a signal bmlaunch sent it (one
 * it forwarded, its own SIGTERM or SIGKILL) has not failed: the run was
 * stopped, and bmlaunch exits 128 + the signal it received. Each rank runs in its own process
 * group, so a rank's children are signalled with it, and dies with bmlaunch (PR_SET_PDEATHSIG);
 * so does the rest of its group, which a guard process kills then (local mode; job_create
 * starts it).
 *
 * Restarts (--max-restarts): after a run that a rank's failure ended, the
 * caller may job_reset the job and spawn every rank again; the signal handling,
 * the log files and the job's start time stay, everything about the last run's
 * processes goes. A run ended by a signal sent to bmlaunch is never restarted.
 */
#ifndef BMT_LAUNCHER_SUPERVISE_H
#define BMT_LAUNCHER_SUPERVISE_H

#include <stdbool.h>
#include <stddef.h>

#include "bmt/error.h"

typedef struct job job_t;

typedef struct job_opts {
    int world;
    double grace_s;      /* SIGTERM -> SIGKILL */
    const char *log_dir; /* NULL: console only */
    bool tee;            /* console as well as log files */
    bool label;          /* "RANK: " before each line */
    int verbose;
    int notify_fd;    /* read end of the PMIx host's event pipe, or -1 */
    bool demux;       /* Slurm mode: one process (srun) whose output is labelled
                       * "RANK: " (srun --label) speaks for all ranks */
    int max_restarts; /* --max-restarts: job_restartable's bound, named in the summary */
    /* Called on the supervisor's thread when a rank's process has exited (local
     * mode; rank -1: srun, Slurm mode), and in Slurm mode for each task srun
     * reports ended ("srun: error: node1: task 2: Exited with exit code 3":
     * wait_status as waitpid would give it, host "node1"; tasks that exit 0
     * are not reported). ended_by: the signal bmlaunch sent that ended it (one
     * it forwarded, or its own SIGTERM or SIGKILL; also an exit with 128 + that
     * signal), 0 when the rank ended by itself. host: NULL in local mode. NULL:
     * none. */
    void (*on_exit)(void *arg, int rank, int wait_status, int ended_by, const char *host);
    void *on_exit_arg;
    /* Slurm mode: deliver SIGINT, SIGTERM, SIGHUP or SIGKILL to every task of
     * srun's job step (slurm_step_signal: srun would turn them into a status
     * request or an immediate SIGKILL). Returns 0 when delivered, 1 when the
     * step is not there (yet), -1 with err on failure; then bmlaunch signals
     * srun as before. After a SIGKILL through it, srun is killed as well. NULL:
     * every signal goes to srun. */
    int (*signal_step)(void *arg, int sig, bmt_error_t *err);
    void *signal_step_arg;
} job_opts_t;

/* Block the signals bmlaunch handles (so they queue for the poll loop, also
 * while the PMIx thread runs), open the job's state and (local mode) start the
 * guard process, which kills every rank's process group should bmlaunch die.
 * Call before any thread starts. */
job_t *job_create(const job_opts_t *opts, bmt_error_t *err);

/* Fork and exec rank: path (resolved), argv (NULL-terminated), envp. */
int job_spawn(job_t *job, int rank, const char *path, char *const argv[], char *const envp[],
              bmt_error_t *err);

/* Slurm mode: fork and exec srun (path, argv, envp), whose labelled output is
 * split per rank (console labels, tails, --log-dir files) and whose own lines
 * ("srun: error: node1: task 2: Exited with exit code 3") name the failure. */
int job_spawn_driver(job_t *job, const char *path, char *const argv[], char *const envp[],
                     bmt_error_t *err);

/* Supervise until every spawned rank has exited and its output is drained.
 * Returns bmlaunch's exit status for this run (see bmlaunch(1)): the first
 * failing rank's, else 128 + N when signal N sent to bmlaunch stopped the run,
 * else 0; job_summary tells why. */
int job_run(job_t *job);

/* After job_run: may the job be started again? True when a rank failed (exit
 * code, signal or PMIx_Abort; not srun itself, not a rank ended by a signal
 * sent to bmlaunch) and fewer than max_restarts restarts were made. Signals
 * that reached bmlaunch since the run ended are read here: SIGINT, SIGTERM or
 * SIGHUP means no (said on stderr). */
bool job_restartable(job_t *job);

/* The last run's failure as one phrase, "rank 2 (pid 7 on vm) exited with code
 * 1" (Slurm mode: "rank 2 (on node1) ..."), into buf. Returns -1 (and "") when
 * no rank failed. */
int job_failure(const job_t *job, char *buf, size_t len);

/* Did this run's failure come from a rank's PMIx_Abort? Then 1, with the rank,
 * the status it gave and its message ("" for none; valid until the next run);
 * else 0. */
int job_aborted(const job_t *job, int *rank, int *status, const char **msg);

/* Which of SIGUSR1 and SIGUSR2 reached bmlaunch since the job began, in any
 * run or between runs (bit N: signal N). A restart hands them to its ranks
 * (BMT_PENDING_SIGNALS), since a warning before the time limit stays true for
 * every later run of the allocation. */
unsigned job_user_signals(const job_t *job);

/* Ready the job for restart number restart (1, 2, ...): forget the last run's
 * processes, failure and output tails, drop PMIx events it left in notify_fd
 * (call after host_renew), and mark the restart in each --log-dir file, which
 * stays open and keeps the last run's output. */
void job_reset(job_t *job, int restart);

/* Print the summary of the last run on stderr (nothing for a job that
 * succeeded, unless verbose or restarted): the failing rank, its last lines, how
 * the others ended, and the restarts made. */
void job_summary(job_t *job);

/* Local mode: the pid of rank's running process, else 0 (Slurm mode, exited,
 * not started). Safe from another thread (an atomic the supervisor sets when
 * it spawns and reaps the rank). */
int job_rank_pid(job_t *job, int rank);

/* SIGKILL every spawned rank's process group and reap them (a failed start). */
void job_kill_all(job_t *job);

/* Free everything. NULL: no-op. The signals job_create blocked stay blocked
 * (call it when the job is over): one that comes as bmlaunch cleans up and
 * exits must not end it with another status than the job's, nor before it
 * removed its files; pending, it goes with the process. */
void job_destroy(job_t *job);

/* Find an executable: a name with '/' is taken as it is, others are searched in
 * PATH. Writes the path to out (len bytes). */
int resolve_program(const char *name, char *out, size_t len, bmt_error_t *err);

/* poll(2)'s timeout for a wait of wait_s seconds: -1 for none (negative or
 * nan), else the milliseconds rounded up, at most 60000 (the loop waits again:
 * a --grace of 1e7 s never overflows int). Pure. */
int supervise_poll_ms(double wait_s);

#endif
