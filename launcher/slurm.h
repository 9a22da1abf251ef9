/* launcher/slurm.h — bmlaunch inside a Slurm allocation.
 *
 * The allocation is read from the environment Slurm gives a job (SLURM_JOB_ID,
 * SLURM_JOB_NUM_NODES, SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE,
 * SLURM_GPUS_ON_NODE); the layout must fit it; the ranks run under
 * `srun --mpi=pmix` (slurmd is their PMIx server), each through
 * `bmlaunch --rank-exec`, which gives it the same BMT_ variables as a local
 * run. The parsing and planning are pure (tested in tests/unit/test_slurm.c).
 */
#ifndef BMT_LAUNCHER_SLURM_H
#define BMT_LAUNCHER_SLURM_H

#include <stdbool.h>

#include "bmt/error.h"
#include "bmt/layout.h"
#include "cli.h"

typedef struct slurm_alloc {
    char job_id[64];
    int nodes;          /* nodes of the allocation */
    int tasks_per_node; /* uniform tasks per node, 0 if unknown or not uniform */
    int cpus_per_node;  /* uniform CPUs per node, 0 if unknown or not uniform */
    int gpus_per_node;  /* SLURM_GPUS_ON_NODE, 0 if none */
} slurm_alloc_t;

/* Read the allocation from getenv. Returns 1 inside an allocation, 0 outside
 * (no SLURM_JOB_ID), -1 when the environment is malformed (err says which
 * variable) or bmlaunch runs as a task of a job step (SLURM_STEP_ID: `srun
 * bmlaunch`, whose own srun would wait for that step's CPUs for ever). */
int slurm_detect(slurm_alloc_t *a, bmt_error_t *err);

/* The same from an explicit environment lookup (for tests). */
int slurm_detect_from(slurm_alloc_t *a, const char *(*get)(const char *name), bmt_error_t *err);

/* Parse a Slurm per-node count list ("4(x2)", "2,2", "8") into one uniform
 * value; 0 when the nodes differ. -1 when malformed. */
int slurm_uniform_count(const char *text, int *out);

/* The layout for o inside allocation a: gpus_per_node defaults to the world
 * divided by --nodes when that is given, else to the allocation's GPUs (cuda)
 * or tasks per node (cpu); the layout's nodes must be at most the
 * allocation's, and with cuda its ranks per node at most the allocation's GPUs
 * and CPUs per node (srun gives each task a CPU). Errors say what does not fit
 * and what to ask for. */
int slurm_plan(const slurm_alloc_t *a, const launch_opts_t *o, bmt_layout_t *l, bmt_error_t *err);

/* srun's argument vector (NULL-terminated, malloc'd strings and array) for the
 * layout: one task per rank, block distribution, --label, --export=ALL (the
 * tasks get bmlaunch's environment even where SLURM_EXPORT_ENV=NONE), the step named
 * step_name (--job-name: slurm_step_signal finds it by that name), each task
 * running `self --rank-exec -- prog args`. No --kill-on-bad-exit: srun would
 * SIGKILL the other tasks at once; bmlaunch ends the step itself (SIGTERM,
 * then SIGKILL after --grace), as in local mode. */
char **slurm_srun_argv(const slurm_alloc_t *a, const launch_opts_t *o, const bmt_layout_t *l,
                       const char *self, const char *step_name);

void slurm_argv_free(char **argv);

/* Is entry ("NAME=value") one of srun's input variables that would change how
 * bmlaunch's srun runs the step behind its back: SLURM_KILL_BAD_EXIT (-K) and
 * SLURM_WAIT (-W) end the other tasks without the --grace, SLURM_NO_KILL (-k)
 * keeps a step whose node failed, SLURM_UNBUFFEREDIO (-u) cuts lines,
 * SLURM_STDOUTMODE, SLURM_STDERRMODE, SLURM_STDINMODE and SLURM_OPEN_MODE (-o,
 * -e, -i) take the tasks' output from bmlaunch, SLURM_DISABLE_STATUS (-X)
 * changes what SIGINT does to srun, SLURM_EXIT_ERROR and SLURM_EXIT_IMMEDIATE
 * change srun's exit status on a Slurm error (0 would read as success)?
 * bmlaunch leaves them out of srun's environment (set in the caller's, by hand
 * or by an outer job). Pure. */
bool slurm_srun_env_overridden(const char *entry);

/* One srun's job step, signalled through Slurm rather than through srun.
 * srun takes SIGINT as a request for status (two within a second: SIGKILL to
 * every task) and SIGTERM/SIGHUP as "SIGKILL every task now", so neither
 * reaches the ranks as the signal with a grace period. `scancel --signal=SIG
 * JOB.STEP` delivers the signal itself to every task on every node and leaves
 * the step running. */
typedef struct slurm_step {
    char job_id[64];  /* the allocation */
    char name[128];   /* srun --job-name of this run's step */
    char id[160];     /* "JOB.STEP" once squeue has shown it, else "" */
    double timeout_s; /* for each squeue or scancel call */
} slurm_step_t;

void slurm_step_init(slurm_step_t *s, const char *job_id, const char *name);

/* Deliver sig to every task of the step: squeue finds the step by its name
 * (once), scancel --signal signals it. Returns 0 when scancel accepted it, 1
 * when squeue does not show the step (not created yet, or ended), -1 when a
 * command failed or timed out (err says which, with its output). */
int slurm_step_signal(slurm_step_t *s, int sig, bmt_error_t *err);

/* Pure: from `squeue -h -s -o "%i %j"` output, the id of the newest step
 * (highest step number) named name into id. Returns 0, or -1 when none. */
int slurm_step_find(const char *squeue_out, const char *name, char *id, size_t len);

/* Run argv (argv[0] searched in PATH) with the default signal mask, stdout and
 * stderr into out (at most len - 1 bytes, NUL-terminated), for at most
 * timeout_s seconds (then SIGKILL). Returns its exit status, or -1 (out says
 * why: could not start, killed by a signal, timed out). */
int slurm_command(char *const argv[], double timeout_s, char *out, size_t len);

/* bmlaunch --rank-exec: in a task started by srun, set BMT_RANK, BMT_LOCAL_RANK,
 * BMT_NODE, BMT_GROUP and BMT_GROUP_RANK from SLURM_PROCID and the BMT_ layout
 * variables, check that srun placed the task where the layout says, and exec
 * the program. Returns only on failure (exit status for main). */
int slurm_rank_exec(int argc, char **argv);

#endif
