/* runtime/fault.c — see fault.h. */
#include "fault.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctx.h"
#include "env.h"
#include "error.h"

/* The len bytes at text as a whole number: decimal digits only (no sign, no
 * blanks), at least one, fitting an int64_t. */
static bool parse_count(const char *text, size_t len, int64_t *out)
{
    int64_t v = 0;
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        int d = text[i] - '0';
        if (d < 0 || d > 9 || v > (INT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

int fault_init(bmt_ctx_t *ctx, bmt_error_t *err)
{
    ctx->fault_where = FAULT_NONE;
    const char *v = env_get("BMT_FAULT");
    if (v == NULL || *v == '\0')
        return 0;
    /* WHERE:RANK:STEP, each number plain digits: a rank that is no rank of the
     * job (or one that wrapped) would never fire, and the test that set it
     * would see a run without its fault. */
    const char *c1 = strchr(v, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    int64_t rank = -1, step = 0;
    size_t wlen = c1 ? (size_t)(c1 - v) : 0;
    bool known = (wlen == 4 && (strncmp(v, "step", 4) == 0 || strncmp(v, "save", 4) == 0)) ||
                 (wlen == 3 && strncmp(v, "nan", 3) == 0);
    if (!known || c2 == NULL || !parse_count(c1 + 1, (size_t)(c2 - c1 - 1), &rank) ||
        !parse_count(c2 + 1, strlen(c2 + 1), &step) || step < 1)
        return errprintf(err,
                         "rank %d: BMT_FAULT='%.900s': use step:RANK:STEP, save:RANK:STEP or "
                         "nan:RANK:STEP (RANK >= 0, STEP >= 1)",
                         ctx->rank, v);
    if (rank >= ctx->world)
        return errprintf(err,
                         "rank %d: BMT_FAULT='%.900s' names rank %lld, but the job has ranks 0 "
                         "to %d only",
                         ctx->rank, v, (long long)rank, ctx->world - 1);
    const char *restart = getenv("BMT_RESTART");
    int64_t runs = 0;
    if (restart && *restart && !parse_count(restart, strlen(restart), &runs))
        return errprintf(err,
                         "rank %d: BMT_RESTART='%.900s' is not a count (bmlaunch sets it; "
                         "BMT_FAULT fires only where it is 0 or unset)",
                         ctx->rank, restart);
    if (runs > 0)
        return 0; /* a restarted run goes through */
    if (rank != ctx->rank)
        return 0;
    ctx->fault_where = wlen == 4 && strncmp(v, "step", 4) == 0   ? FAULT_STEP
                       : wlen == 4 && strncmp(v, "save", 4) == 0 ? FAULT_SAVE
                                                                 : FAULT_NAN;
    ctx->fault_step = step;
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
