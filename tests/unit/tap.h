/* tests/unit/tap.h — a tiny TAP producer for the C unit tests.
 *
 *   ok(cond, "fmt", ...)      one test point; prints "ok N - ..." or "not ok N - ..."
 *   is_int(got, want, "...")  ok() that also prints both values when they differ
 *   is_str(got, want, "...")
 *   diag("fmt", ...)          a "# ..." comment line
 *   return done_testing();    prints the plan "1..N"; exit status 1 if any failed
 *
 * tests/run counts the "ok" and "not ok" lines of every test program.
 */
#ifndef BMT_TESTS_TAP_H
#define BMT_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

static inline int tap_ok(int cond, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int tap_ok(int cond, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    printf("%sok %d - ", cond ? "" : "not ", ++tap_n);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond) {
        tap_failed++;
        printf("#   failed at %s:%d\n", file, line);
    }
    fflush(stdout);
    return cond;
}

#define ok(cond, ...) tap_ok(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

static inline void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static inline int tap_is_int(long long got, long long want, const char *file, int line,
                             const char *what)
{
    int cond = got == want;
    tap_ok(cond, file, line, "%s", what);
    if (!cond)
        printf("#   got %lld, want %lld\n", got, want);
    return cond;
}
#define is_int(got, want, what)                                                                    \
    tap_is_int((long long)(got), (long long)(want), __FILE__, __LINE__, (what))

static inline int tap_is_str(const char *got, const char *want, const char *file, int line,
                             const char *what)
{
    int cond = got && want && strcmp(got, want) == 0;
    tap_ok(cond, file, line, "%s", what);
    if (!cond)
        printf("#   got '%s'\n#  want '%s'\n", got ? got : "(null)", want ? want : "(null)");
    return cond;
}
#define is_str(got, want, what) tap_is_str((got), (want), __FILE__, __LINE__, (what))

static inline int done_testing(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}

#endif
