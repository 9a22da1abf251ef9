/* launcher/torchenv.h — torchrun's environment for every rank (PyTorch jobs).
 *
 * An unmodified torch.distributed program calls init_process_group() with the
 * default env:// and reads RANK, WORLD_SIZE, LOCAL_RANK, ... as torchrun sets
 * them. bmlaunch sets the same names with torchrun's meanings, beside (never
 * instead of) the BMT_ layout, in local and in Slurm mode:
 *
 *   RANK, ROLE_RANK           the rank (BMT_RANK)
 *   WORLD_SIZE, ROLE_WORLD_SIZE  the world (BMT_WORLD_SIZE)
 *   LOCAL_RANK                rank within the node (BMT_LOCAL_RANK)
 *   LOCAL_WORLD_SIZE          ranks per node (BMT_GPUS_PER_NODE)
 *   GROUP_RANK, NODE_RANK     the node's index (BMT_NODE): torchrun's "group" is
 *                             a node, not bmt's ZeRO group (BMT_GROUP)
 *   GROUP_WORLD_SIZE          nodes (BMT_NODES)
 *   ROLE_NAME                 "default"
 *   MASTER_ADDR, MASTER_PORT  where rank 0's TCPStore listens
 *   TORCHELASTIC_RESTART_COUNT  BMT_RESTART
 *   TORCHELASTIC_MAX_RESTARTS   --max-restarts
 *   TORCHELASTIC_RUN_ID         BMT_JOB_ID
 *
 * Inherited values of these names (and TORCHELASTIC_USE_AGENT_STORE and
 * TORCHELASTIC_ERROR_FILE, which would point torch at an agent or file of an
 * outer torchrun) are dropped. OMP_NUM_THREADS is left as the user set it.
 *
 * MASTER_PORT: locally, a port the kernel reports free on this machine, kept
 * reserved by bmlaunch during the run (torchenv_port_reserve), picked anew for
 * every run (a restart never meets the last run's TIME_WAIT sockets or a rank
 * 0 still dying). Under Slurm, rank 0 may run on another node than
 * bmlaunch, so bmlaunch cannot probe its ports: the port is derived from the
 * job id, bmlaunch's pid and the restart number (each restart another port)
 * in TORCHENV_PORT_BASE ..
 * +TORCHENV_PORT_SPAN-1 (below Linux's ephemeral range, so no outgoing
 * connection holds it by chance), and rank 0's wrapper checks it is free there
 * and that MASTER_ADDR is its own node (torchenv_check_master).
 */
#ifndef BMT_LAUNCHER_TORCHENV_H
#define BMT_LAUNCHER_TORCHENV_H

#include <stdbool.h>
#include <stddef.h>

#include "bmt/bmt.h"

#define TORCHENV_MAX 16 /* entries torchenv_add may append */
#define TORCHENV_PORT_BASE 20000
#define TORCHENV_PORT_SPAN 10000

typedef struct torchenv {
    char master_addr[256]; /* "": unknown, MASTER_ADDR is not set */
    int master_port;       /* 0: MASTER_PORT is not set */
    int restart;           /* TORCHELASTIC_RESTART_COUNT */
    int max_restarts;      /* TORCHELASTIC_MAX_RESTARTS */
    const char *run_id;    /* TORCHELASTIC_RUN_ID (borrowed) */
} torchenv_t;

/* Is entry ("NAME=value") one of the variables bmlaunch sets or drops for
 * torch? Pure. */
bool torchenv_is_ours(const char *entry);

/* Append malloc'd "NAME=value" strings to env (room for TORCHENV_MAX more): the
 * job's variables and, for rank >= 0, the rank's (rank < 0: the srun
 * environment; bmlaunch --rank-exec adds the rank's in each task through
 * torchenv_setenv_rank). Returns how many were appended. */
int torchenv_add(char **env, const torchenv_t *t, const bmt_layout_t *l, int rank);

/* In bmlaunch --rank-exec: setenv the per-rank variables of rank. */
void torchenv_setenv_rank(const bmt_layout_t *l, int rank);

/* Local mode's MASTER_PORT: a TCP port free on every address of this machine,
 * kept reserved through *fd (a socket bound with SO_REUSEADDR, not listening,
 * close-on-exec) until the caller closes it after the run: no other process
 * gets the port meanwhile, and rank 0's TCPStore can still listen on it.
 * Returns the port, or -1 with err. */
int torchenv_port_reserve(int *fd, bmt_error_t *err);

/* Slurm mode's MASTER_PORT for run restart of bmlaunch pid in job job_id, in
 * [TORCHENV_PORT_BASE, +TORCHENV_PORT_SPAN): a hash of job and pid, then a
 * fixed step per restart, so no two of TORCHENV_PORT_SPAN consecutive runs
 * share a port. Pure. */
int torchenv_port_for(const char *job_id, long pid, int restart);

/* Rank 0's check under Slurm: addr is an address of this node and port can be
 * listened on. Returns 0, or -1 with err saying what torch will meet. */
int torchenv_check_master(const char *addr, int port, bmt_error_t *err);

/* Slurm mode's MASTER_ADDR: the address of the first node of nodelist (where
 * srun --distribution=block puts rank 0), as Slurm reaches it (its NodeAddr),
 * through scontrol. Returns 0, or -1 with err. */
int torchenv_slurm_master_addr(const char *nodelist, char *out, size_t len, bmt_error_t *err);

/* The NodeAddr=... of `scontrol show node -o NAME` output into out; -1 when
 * absent. Pure. */
int torchenv_parse_nodeaddr(const char *scontrol_out, char *out, size_t len);

#endif
