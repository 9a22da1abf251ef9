/* launcher/local.h — bmlaunch as the PMIx server of its ranks (local mode).
 *
 * The PMIx library runs its own progress thread and calls our module callbacks
 * there. Those never block and never touch launcher state: they package what
 * happened as a host_event_t and write its pointer to notify_fd, which the
 * supervisor's poll loop reads. Abort requests carry the PMIx callback, which the
 * supervisor calls once it has started ending the job.
 */
#ifndef BMT_LAUNCHER_LOCAL_H
#define BMT_LAUNCHER_LOCAL_H

#include <stdbool.h>

#include "bmt/error.h"
#include "bmt/layout.h"

typedef struct pmix_host pmix_host_t;

typedef enum host_event_kind {
    HOST_CONNECTED, /* a rank called PMIx_Init */
    HOST_FINALIZED, /* a rank called PMIx_Finalize */
    HOST_ABORT,     /* a rank called PMIx_Abort(status, msg) */
} host_event_kind_t;

typedef struct host_event {
    host_event_kind_t kind;
    int rank;
    int status;                                  /* HOST_ABORT */
    char msg[BMT_ERROR_TEXT_MAX];                /* HOST_ABORT */
    void (*done)(int pmix_status, void *cbdata); /* release the caller (HOST_ABORT) */
    void *done_data;
} host_event_t;

/* The PMIx job keys that carry the bmt layout (read back by runtime/init.c). */
#define HOST_KEY_GROUPS "bmt.groups"
#define HOST_KEY_GPUS_PER_GROUP "bmt.gpus_per_group"
#define HOST_KEY_GPUS_PER_NODE "bmt.gpus_per_node"

/* Start the PMIx server in a private temporary directory and register the job
 * (namespace nspace, all l->world ranks on this node) with the standard job,
 * node and proc keys plus the bmt layout. Events go to notify_fd as pointers to
 * malloc'd host_event_t (the reader frees them). */
int host_start(pmix_host_t **out, const char *nspace, const bmt_layout_t *l, int notify_fd,
               bmt_error_t *err);

/* Prepare rank: register it as a client and add PMIx's variables to *envp, a
 * NULL-terminated malloc'd array of malloc'd strings that PMIx may grow. */
int host_setup_rank(pmix_host_t *h, int rank, char ***envp, bmt_error_t *err);

/* A restart: deregister the job's namespace (releasing its clients, which must
 * all have exited) and register the same job again as nspace, a name not used
 * before. Events of the old namespace that PMIx posted before this returns are
 * in notify_fd already (the supervisor drops them, job_reset); none come
 * after. */
int host_renew(pmix_host_t *h, const char *nspace, bmt_error_t *err);

/* Release the client registrations and the server; remove the temporary
 * directory. NULL: no-op. PMIx_server_finalize gets 10 s (libpmix can hang
 * in it); past that host_stop says so on stderr and returns without it, and
 * host_finalize_stuck() is true from then on: end the process with _exit. */
void host_stop(pmix_host_t *h);
bool host_finalize_stuck(void);
/* The environment's test hooks for local mode (BMLAUNCH_FAULT) are known
 * values: 0, or -1 and err. */
int host_check_env(bmt_error_t *err);

#endif
