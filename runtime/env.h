/* runtime/env.h — the BMT_ environment knobs, declared in one table (env.c).
 *
 * Every knob libbmt or bmlaunch reads is a row of that table with its default and
 * one line of documentation; docs/env.md lists the same rows (a test checks).
 * Reading a name that is not in the table is a programming error and returns NULL.
 */
#ifndef BMT_RUNTIME_ENV_H
#define BMT_RUNTIME_ENV_H

#include <stdbool.h>
#include <stddef.h>

#include "bmt/error.h"

typedef struct env_knob {
    const char *name;
    const char *deflt; /* NULL: unset by default */
    const char *doc;
} env_knob_t;

/* The table, terminated by a row with name NULL. */
const env_knob_t *env_knobs(void);

/* Value of knob name from the environment, else its default (may be NULL). */
const char *env_get(const char *name);

/* Is v a plain decimal: digits, or digits with one '.' and digits (at least
 * one digit in all; no blanks, sign, hex or exponent)? */
bool env_plain_decimal(const char *v);

/* Parse knob name as a positive number of seconds (fractions allowed). */
int env_get_seconds(const char *name, double *out, bmt_error_t *err);

/* Parse knob name as a positive integer; *out untouched when unset and no default.
 * Returns 1 when set (or defaulted), 0 when unset, -1 on a malformed value. */
int env_get_positive(const char *name, int *out, bmt_error_t *err);

/* Parse knob name as a flag: exactly "0" or "1" (its default when unset). */
int env_get_flag(const char *name, bool *out, bmt_error_t *err);

/* Parse knob name as a byte count with an optional K/M/G suffix (powers of 1024);
 * digits first (no blank or sign). */
int env_get_bytes(const char *name, size_t *out, bmt_error_t *err);

#endif
