/* runtime/error.h — filling a bmt_error_t (internal to libbmt and bmlaunch).
 *
 * errprintf() formats one line into err (when err is not NULL) and returns -1 so
 * that callers write `return errprintf(err, "...")`. errprefix() prepends context
 * ("rank 3: ") to a message a callee already wrote.
 */
#ifndef BMT_RUNTIME_ERROR_H
#define BMT_RUNTIME_ERROR_H

#include "bmt/error.h"

#if defined(__GNUC__)
#define BMT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define BMT_PRINTF(a, b)
#endif

int errprintf(bmt_error_t *err, const char *fmt, ...) BMT_PRINTF(2, 3);
int errprefix(bmt_error_t *err, const char *fmt, ...) BMT_PRINTF(2, 3);

#endif
