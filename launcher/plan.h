/* launcher/plan.h — print a layout for people (--plan) or tools (--plan --json). */
#ifndef BMT_LAUNCHER_PLAN_H
#define BMT_LAUNCHER_PLAN_H

#include <stdbool.h>
#include <stdio.h>

#include "bmt/error.h"
#include "bmt/layout.h"
#include "costmodel.h"

/* Text: a summary, a table of groups and one of nodes (long tables elided), the
 * rail-alignment verdict and aligned alternatives. JSON: the same facts plus
 * every group, replica communicator and rank. With cin and the n candidates of
 * costmodel_rank (NULL and 0 for none) the cost model follows the text, or is
 * the JSON's "cost_model" object. out is flushed. Returns 0, or -1 with err set
 * on a write error (out's errno) or when the JSON cannot be encoded. */
int plan_print(FILE *out, const bmt_layout_t *l, bool json, const costmodel_in_t *cin,
               const costmodel_candidate_t *cand, size_t n, bmt_error_t *err);

#endif
