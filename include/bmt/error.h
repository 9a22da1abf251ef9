/* bmt/error.h — how libbmt reports failure.
 *
 * Every fallible call returns 0 (or a pointer) on success and -1 (or NULL) on
 * failure, has no side effects on failure, and fills the caller's bmt_error_t
 * (when not NULL) with one line naming the call, the rank and the cause, e.g.
 *   "rank 3: ncclCommInitRankConfig(world): unhandled system error (after 2.0 s)".
 * The library never calls exit(); only main() functions die.
 */
#ifndef BMT_ERROR_H
#define BMT_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(BMT_BUILDING_LIBRARY) && defined(__GNUC__)
#define BMT_API __attribute__((visibility("default")))
#else
#define BMT_API
#endif

/* Long enough for the paths, names and sizes a message carries whole (a
 * checkpoint's file and tensor, a rank's host): a name is quoted whole up to
 * 900 bytes and a path up to 1200, and a message that would still overflow
 * keeps its first 600 bytes and its end (the cause), with " ... " between,
 * cut between UTF-8 characters (docs/runtime.md, Errors). */
#define BMT_ERROR_TEXT_MAX 2048
typedef struct bmt_error {
    char text[BMT_ERROR_TEXT_MAX];
} bmt_error_t;

#ifdef __cplusplus
}
#endif
#endif
