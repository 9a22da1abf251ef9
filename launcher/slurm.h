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
 * variable). */
int slurm_detect(slurm_alloc_t *a, bmt_error_t *err);

/* The same from an explicit environment lookup (for tests). */
int slurm_detect_from(slurm_alloc_t *a, const char *(*get)(const char *name), bmt_error_t *err);

/* Parse a Slurm per-node count list ("4(x2)", "2,2", "8") into one uniform
 * value; 0 when the nodes differ. -1 when malformed. */
int slurm_uniform_count(const char *text, int *out);

/* The layout for o inside allocation a: gpus_per_node defaults to the
 * allocation's GPUs (cuda) or tasks per node (cpu); the layout's nodes must be
 * at most the allocation's. Errors say what does not fit and what to ask for. */
int slurm_plan(const slurm_alloc_t *a, const launch_opts_t *o, bmt_layout_t *l, bmt_error_t *err);

/* srun's argument vector (NULL-terminated, malloc'd strings and array) for the
 * layout: one task per rank, block distribution, --kill-on-bad-exit, --label,
 * each task running `self --rank-exec -- prog args`. */
char **slurm_srun_argv(const slurm_alloc_t *a, const launch_opts_t *o, const bmt_layout_t *l,
                       const char *self);

void slurm_argv_free(char **argv);

/* bmlaunch --rank-exec: in a task started by srun, set BMT_RANK, BMT_LOCAL_RANK,
 * BMT_NODE, BMT_GROUP and BMT_GROUP_RANK from SLURM_PROCID and the BMT_ layout
 * variables, check that srun placed the task where the layout says, and exec
 * the program. Returns only on failure (exit status for main). */
int slurm_rank_exec(int argc, char **argv);

#endif
