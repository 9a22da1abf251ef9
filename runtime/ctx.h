/* runtime/ctx.h — the per-process runtime context (internal).
 *
 * init.c creates it in bmt_init and frees it in bmt_finalize; the other modules
 * read it. Nothing here is shared between processes.
 */
#ifndef BMT_RUNTIME_CTX_H
#define BMT_RUNTIME_CTX_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/bmt.h"
#include "boot.h"
#include "comm.h"
#include "device.h"

struct bmt_ctx {
    boot_t *boot;
    int rank;
    int world;
    bmt_layout_t layout;
    bmt_rank_info_t self;
    bmt_device_kind_t device;
    int device_index; /* CUDA ordinal, -1 on CPU */
    double timeout_s;
    /* BMT_CHECK_COLLECTIVES: agree before every collective (comm.c) */
    bool check_collectives;
    int fault_where; /* fault.h: BMT_FAULT for this rank (FAULT_NONE: none) */
    int64_t fault_step;
    uint64_t job_hash; /* hash of the PMIx namespace and uid: names shared objects */
    const struct comm_backend *backend;
    bmt_comm_t *world_comm;
    bmt_comm_t *group_comm;
    bmt_comm_t *replica_comm;
    bool comm_failed;              /* a collective failed: finalize aborts instead of flushing */
    int live_lists, live_optims;   /* not yet destroyed: bmt_finalize keeps the context then */
    void *mem;                     /* device.c's allocation table (NULL until first use) */
    void *streams[DEVICE_STREAMS]; /* cudaStream_t; NULL on cpu */
    void *pools[DEVICE_STREAMS]; /* cudaMemPool_t of bmt_alloc_async per stream; NULL until used */
    void *waits;                 /* device.c's timing of compute-stream waits (cuda) */
    double comm_host_s;          /* seconds spent in synchronous collectives (comm.c) */
    struct monitor *monitor;     /* monitor.c: plugins and step clock; NULL: none yet */
};

#endif
