/* tests/unit/test_supervise.c — the supervisor's pure arithmetic
 * (launcher/supervise.c), table-driven: poll(2)'s timeout for a wait, which
 * once overflowed int for a --grace above ~2.1e6 s (the CLI takes up to 1e7):
 * the timeout went negative, poll waited forever, and the SIGKILL after the
 * grace period never came. (tests/integration/test_supervise.sh drives the
 * supervisor itself.)
 */
#include <math.h>
#include <stdio.h>

#include "supervise.h"
#include "tap.h"

int main(void)
{
    static const struct {
        double wait;
        int want;
        const char *what;
    } cases[] = {
        { -1.0, -1, "no deadline" },
        { -1e-9, -1, "a deadline just passed: no wait (the caller handles it first)" },
        { 0.0, 1, "now: 1 ms (rounded up)" },
        { 0.0004, 1, "0.4 ms: 1 ms" },
        { 0.25, 251, "a quarter second" },
        { 5.0, 5001, "the default grace" },
        { 59.5, 59501, "under a minute" },
        { 60.0, 60001, "a minute" },
        { 60.5, 60000, "over a minute: a minute, then the loop waits again" },
        { 2.2e6, 60000, "--grace 2.2e6 s, which overflowed int" },
        { 1e7, 60000, "--grace 1e7 s, the CLI's largest" },
        { 1e300, 60000, "absurd" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = supervise_poll_ms(cases[i].wait);
        ok(got == cases[i].want, "poll timeout for %g s: %d ms, want %d: %s", cases[i].wait, got,
           cases[i].want, cases[i].what);
    }
    is_int(supervise_poll_ms(NAN), -1, "nan: no deadline");
    return done_testing();
}
