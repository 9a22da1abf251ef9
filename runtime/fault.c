/* runtime/fault.c — see fault.h. */
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctx.h"
#include "env.h"
#include "error.h"

int fault_init(bmt_ctx_t *ctx, bmt_error_t *err)
{
    ctx->fault_where = FAULT_NONE;
    const char *v = env_get("BMT_FAULT");
    if (v == NULL || *v == '\0')
        return 0;
    char where[16];
    int rank, n = 0;
    long long step;
    if (sscanf(v, "%15[a-z]:%d:%lld%n", where, &rank, &step, &n) != 3 || v[n] != '\0' ||
        (strcmp(where, "step") != 0 && strcmp(where, "save") != 0 && strcmp(where, "nan") != 0) ||
        rank < 0 || step < 1)
        return errprintf(err,
                         "rank %d: BMT_FAULT='%.900s': use step:RANK:STEP, save:RANK:STEP or "
                         "nan:RANK:STEP (RANK >= 0, STEP >= 1)",
                         ctx->rank, v);
    const char *restart = getenv("BMT_RESTART");
    if (restart && *restart && strcmp(restart, "0") != 0)
        return 0; /* a restarted run goes through */
    if (rank != ctx->rank)
        return 0;
    ctx->fault_where = strcmp(where, "step") == 0   ? FAULT_STEP
                       : strcmp(where, "save") == 0 ? FAULT_SAVE
                                                    : FAULT_NAN;
    ctx->fault_step = (int64_t)step;
    return 0;
}

void fault_point(const bmt_ctx_t *ctx, fault_where_t where, int64_t step)
{
    if (ctx->fault_where != (int)where || ctx->fault_step != step)
        return;
    fprintf(stderr, "bmt: rank %d: BMT_FAULT: killing myself %s step %lld\n", ctx->rank,
            where == FAULT_STEP ? "after" : "while saving", (long long)step);
    fflush(stderr);
    raise(SIGKILL);
}

bool fault_due(const bmt_ctx_t *ctx, fault_where_t where, int64_t step)
{
    if (ctx->fault_where != (int)where || ctx->fault_step != step)
        return false;
    fprintf(stderr, "bmt: rank %d: BMT_FAULT: planting a NaN in a parameter after step %lld\n",
            ctx->rank, (long long)step);
    fflush(stderr);
    return true;
}
