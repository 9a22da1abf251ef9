/* runtime/fault.h — fault injection for the tests of restarts and checkpoints.
 *
 * BMT_FAULT=WHERE:RANK:STEP makes rank RANK kill itself with SIGKILL (a crash
 * nothing can clean up after) at a chosen point of optimizer step STEP:
 *   step   after bmt_optim_step has finished step STEP;
 *   save   in the middle of writing the checkpoint saved after step STEP (after
 *          the first piece of its shards is written);
 * or damages its state without dying:
 *   nan    after bmt_optim_step has finished step STEP, the first element of
 *          this rank's first parameter shard becomes NaN (master and
 *          parameter): a diverged run, for the tests of what stops one.
 * It fires in the first run only (BMT_RESTART unset or 0), so that a job that
 * bmlaunch --max-restarts restarts goes through. Parsed in bmt_init; a
 * malformed value fails it (RANK and STEP plain digits, RANK a rank of the
 * job), as does a BMT_RESTART that is not a count while BMT_FAULT is set.
 */
#ifndef BMT_RUNTIME_FAULT_H
#define BMT_RUNTIME_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/bmt.h"

typedef enum fault_where {
    FAULT_NONE = 0,
    FAULT_STEP,
    FAULT_SAVE,
    FAULT_NAN
} fault_where_t;

/* Read BMT_FAULT (and BMT_RESTART) for this rank. 0, or -1 with err. */
int fault_init(bmt_ctx_t *ctx, bmt_error_t *err);

/* Kill this process now if the fault is (where, step) (step and save). */
void fault_point(const bmt_ctx_t *ctx, fault_where_t where, int64_t step);

/* Whether the fault is (where, step), said on stderr when it is (nan: the
 * caller does the damage). */
bool fault_due(const bmt_ctx_t *ctx, fault_where_t where, int64_t step);

#endif
