/* runtime/boot.h — joining the job through PMIx (the out-of-band channel).
 *
 * Before any communicator exists, ranks talk through the PMIx server that started
 * them (bmlaunch in local mode, slurmstepd under srun). This module is the only
 * one that includes pmix.h. A process started without PMIx (no PMIX_NAMESPACE in
 * its environment) gets a singleton boot: rank 0 of 1, exchanges are copies.
 */
#ifndef BMT_RUNTIME_BOOT_H
#define BMT_RUNTIME_BOOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bmt/error.h"

typedef struct boot boot_t;

typedef struct boot_info {
    int rank;         /* PMIx rank */
    int size;         /* PMIX_JOB_SIZE */
    int local_rank;   /* PMIX_LOCAL_RANK */
    int local_size;   /* PMIX_LOCAL_SIZE */
    int node_id;      /* PMIX_NODEID */
    char nspace[256]; /* PMIx namespace ("singleton" without PMIx) */
    char hostname[256];
    bool singleton;
} boot_info_t;

/* Join the job. timeout_s bounds every fence. */
int boot_init(boot_t **out, double timeout_s, bmt_error_t *err);
void boot_finalize(boot_t *b);
const boot_info_t *boot_info(const boot_t *b);

/* Job-level unsigned integer key registered by the launcher (e.g. "bmt.groups").
 * Returns 1 and sets *out when present, 0 when absent, -1 on error. */
int boot_job_uint(boot_t *b, const char *key, uint32_t *out, bmt_error_t *err);

/* Every rank contributes len bytes; all receives size*len bytes, by rank.
 * Collective over the whole job (Put, Commit, Fence with collect, Get). */
int boot_allgather(boot_t *b, const void *mine, size_t len, void *all, bmt_error_t *err);

/* Publish len bytes under a fresh key (collective: Put, Commit, Fence) and fetch
 * a peer's bytes of the latest publication (local). */
int boot_publish(boot_t *b, const void *mine, size_t len, bmt_error_t *err);
int boot_fetch(boot_t *b, int peer, void *buf, size_t len, bmt_error_t *err);

/* Root's len bytes land in every rank's buf. Collective over the whole job. */
int boot_bcast(boot_t *b, int root, void *buf, size_t len, bmt_error_t *err);

/* Whether every rank's len bytes equal rank 0's. Collective over the whole job:
 * Put, Commit, Fence(collect); rank 0 alone reads the others' bytes (O(size)
 * gets in all, not O(size^2) as an all-gather) and broadcasts the verdict. On
 * every rank *first is the lowest rank whose bytes differ (-1: none), zero gets
 * rank 0's bytes and theirs rank *first's (mine when none differs). */
int boot_agree(boot_t *b, const void *mine, size_t len, int *first, void *zero, void *theirs,
               bmt_error_t *err);

/* A fence without data. Collective over the whole job. */
int boot_barrier(boot_t *b, bmt_error_t *err);

/* PMIx_Abort: the server ends the job. Returns only if that failed. */
void boot_abort(boot_t *b, int status, const char *msg);

#endif
