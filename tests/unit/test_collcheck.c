/* tests/unit/test_collcheck.c — the collective descriptors of runtime/comm.c
 * (BMT_CHECK_COLLECTIVES and the shm backend's always-on check) and the
 * knob's parser (runtime/env.c).
 *
 * Pure functions, table-driven: how a call is made canonical, how it is spelled,
 * which rank is named when the ranks disagree and the exact message, then the
 * values BMT_CHECK_COLLECTIVES accepts and the ones it refuses.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/bmt.h"
#include "comm.h"
#include "env.h"
#include "tap.h"

#define ID 0x1234abcd5678ef00ULL

static comm_desc_t ag(uint64_t n, bmt_dtype_t t)
{
    return comm_desc_make(COMM_ALL_GATHER, n, t, -1, -1, ID, 5);
}

static comm_desc_t ar(uint64_t n, bmt_dtype_t t, bmt_op_t op)
{
    return comm_desc_make(COMM_ALL_REDUCE, n, t, op, -1, ID, 5);
}

static comm_desc_t rs(uint64_t n, bmt_dtype_t t, bmt_op_t op)
{
    return comm_desc_make(COMM_REDUCE_SCATTER, n, t, op, -1, ID, 5);
}

static comm_desc_t bc(uint64_t n, bmt_dtype_t t, int root)
{
    return comm_desc_make(COMM_BROADCAST, n, t, -1, root, ID, 5);
}

static comm_desc_t bar(void) { return comm_desc_make(COMM_BARRIER, 0, -1, -1, -1, ID, 5); }

static void test_make(void)
{
    /* Fields a kind does not use never make two equal calls differ. */
    struct {
        const char *what;
        comm_desc_t a, b;
        bool equal;
    } cases[] = {
        { "barrier ignores count, dtype, op and root",
          comm_desc_make(COMM_BARRIER, 7, BMT_F32, BMT_MAX, 3, ID, 1),
          comm_desc_make(COMM_BARRIER, 0, BMT_BF16, -1, -1, ID, 1), true },
        { "all_gather ignores op and root",
          comm_desc_make(COMM_ALL_GATHER, 9, BMT_F32, 2, 1, ID, 1),
          comm_desc_make(COMM_ALL_GATHER, 9, BMT_F32, 0, 0, ID, 1), true },
        { "all_reduce ignores root", comm_desc_make(COMM_ALL_REDUCE, 9, BMT_F32, BMT_SUM, 1, ID, 1),
          comm_desc_make(COMM_ALL_REDUCE, 9, BMT_F32, BMT_SUM, 0, ID, 1), true },
        { "broadcast ignores op", comm_desc_make(COMM_BROADCAST, 9, BMT_F32, BMT_MAX, 1, ID, 1),
          comm_desc_make(COMM_BROADCAST, 9, BMT_F32, BMT_SUM, 1, ID, 1), true },
        /* expected failures: every field a kind uses counts */
        { "kinds differ", ag(4, BMT_F32), ar(4, BMT_F32, BMT_SUM), false },
        { "counts differ", ar(4, BMT_F32, BMT_SUM), ar(5, BMT_F32, BMT_SUM), false },
        { "dtypes differ", ar(4, BMT_F32, BMT_SUM), ar(4, BMT_F64, BMT_SUM), false },
        { "ops differ", rs(4, BMT_F32, BMT_SUM), rs(4, BMT_F32, BMT_AVG), false },
        { "roots differ", bc(4, BMT_F32, 0), bc(4, BMT_F32, 1), false },
        { "communicators differ", comm_desc_make(COMM_BARRIER, 0, -1, -1, -1, ID, 1),
          comm_desc_make(COMM_BARRIER, 0, -1, -1, -1, ID + 1, 1), false },
        { "call numbers differ", comm_desc_make(COMM_BARRIER, 0, -1, -1, -1, ID, 1),
          comm_desc_make(COMM_BARRIER, 0, -1, -1, -1, ID, 2), false },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ok(comm_desc_equal(&cases[i].a, &cases[i].b) == cases[i].equal, "make/equal: %s (%s)",
           cases[i].what, cases[i].equal ? "equal" : "differ");
    comm_desc_t d = bar();
    ok(d.magic == COMM_DESC_MAGIC && d.id == ID && d.seq == 5, "make fills magic, id and seq");
}

static void test_format(void)
{
    comm_desc_t junk;
    memset(&junk, 0x5a, sizeof(junk));
    comm_desc_t other_id = comm_desc_make(COMM_ALL_GATHER, 4096, BMT_BF16, -1, -1, ID + 1, 5);
    comm_desc_t other_seq = comm_desc_make(COMM_ALL_GATHER, 4096, BMT_BF16, -1, -1, ID, 57);
    comm_desc_t bad_t = comm_desc_make(COMM_ALL_REDUCE, 1, 9, 7, -1, ID, 5);
    comm_desc_t unknown = comm_desc_make(COMM_BARRIER, 0, -1, -1, -1, ID, 5);
    unknown.kind = 42;
    struct {
        comm_desc_t d;
        const comm_desc_t *vs;
        const char *want;
    } cases[] = {
        { ag(4096, BMT_BF16), NULL, "all_gather(count 4096, bf16)" },
        { ar(1, BMT_F64, BMT_SUM), NULL, "all_reduce(count 1, f64, sum)" },
        { rs(300001, BMT_F32, BMT_AVG), NULL, "reduce_scatter(count 300001, f32, avg)" },
        { ar(0, BMT_BF16, BMT_MAX), NULL, "all_reduce(count 0, bf16, max)" },
        { bc(7, BMT_F32, 3), NULL, "broadcast(count 7, f32, root 3)" },
        { bar(), NULL, "barrier()" },
        { comm_desc_make(COMM_SPLIT, 0, -1, -1, -1, ID, 0), NULL, "a split of the communicator" },
        { comm_desc_make(COMM_CHECK, 48, -1, -1, -1, ID, 0), NULL,
          "a collective check (BMT_CHECK_COLLECTIVES=1)" },
        { comm_desc_make(COMM_KIND_NONE, 0, -1, -1, -1, ID, 0), NULL,
          "the next step of a longer collective" },
        { junk, NULL, "no collective check (is BMT_CHECK_COLLECTIVES=1 on every rank?)" },
        { bad_t, NULL, "all_reduce(count 1, dtype 9, op 7)" },
        { unknown, NULL, "an unknown collective (kind 42)" },
        /* id and seq only where they differ from the other side */
        { ag(4096, BMT_BF16), &other_id,
          "all_gather(count 4096, bf16) on communicator 1234abcd5678ef00" },
        { ag(4096, BMT_BF16), &other_seq, "all_gather(count 4096, bf16) as call #5" },
        { ag(4096, BMT_BF16), &junk, "all_gather(count 4096, bf16)" },
    };
    char buf[160];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        is_str(comm_desc_format(buf, sizeof(buf), &cases[i].d, cases[i].vs), cases[i].want,
               cases[i].want);
    char tiny[8];
    comm_desc_t d = ar(1, BMT_F64, BMT_SUM);
    comm_desc_format(tiny, sizeof(tiny), &d, NULL);
    is_str(tiny, "all_red", "format: a short buffer is cut and terminated");
}

static void test_check(void)
{
    enum {
        N = 4
    };
    comm_desc_t x = ar(1, BMT_F64, BMT_SUM), y = ag(4096, BMT_BF16);
    comm_desc_t x57 = comm_desc_make(COMM_ALL_REDUCE, 1, BMT_F64, BMT_SUM, -1, ID, 57);
    comm_desc_t x58 = comm_desc_make(COMM_ALL_REDUCE, 1, BMT_F64, BMT_SUM, -1, ID, 58);
    comm_desc_t xid = comm_desc_make(COMM_ALL_REDUCE, 1, BMT_F64, BMT_SUM, -1, 0xfeed, 5);
    comm_desc_t junk;
    memset(&junk, 0, sizeof(junk));
    static const int replica1[N] = { 1, 3, 5, 7 };
    static const int same[N] = { 0, 1, 2, 3 };
    const char *lead = "rank 1: collective check (group 0, call #57): ";
    struct {
        const char *what;
        int n;
        comm_desc_t all[N];
        const int *members;
        int first;        /* comm_desc_first_diff */
        const char *want; /* NULL: they agree */
    } cases[] = {
        { "one rank agrees with itself", 1, { x }, NULL, -1, NULL },
        { "four equal descriptors", 4, { x, x, x, x }, NULL, -1, NULL },
        /* expected failures */
        { "all_gather against all_reduce",
          2,
          { x, y },
          NULL,
          1,
          "rank 1: collective check (group 0, call #57): rank 1 issued all_gather(count 4096, "
          "bf16) while rank 0 issued all_reduce(count 1, f64, sum)" },
        { "the lowest differing rank is named",
          4,
          { x, x, y, y },
          NULL,
          2,
          "rank 1: collective check (group 0, call #57): rank 2 issued all_gather(count 4096, "
          "bf16) while rank 0 issued all_reduce(count 1, f64, sum)" },
        { "rank 0 alone differs: rank 1 is named",
          4,
          { y, x, x, x },
          NULL,
          1,
          "rank 1: collective check (group 0, call #57): rank 1 issued all_reduce(count 1, f64, "
          "sum) while rank 0 issued all_gather(count 4096, bf16)" },
        { "world ranks of a replica communicator",
          4,
          { x, x, x, y },
          replica1,
          3,
          "rank 1: collective check (group 0, call #57): rank 3 (world rank 7) issued "
          "all_gather(count 4096, bf16) while rank 0 (world rank 1) issued all_reduce(count 1, "
          "f64, sum)" },
        { "an identity member table adds no world ranks",
          2,
          { x, y },
          same,
          1,
          "rank 1: collective check (group 0, call #57): rank 1 issued all_gather(count 4096, "
          "bf16) while rank 0 issued all_reduce(count 1, f64, sum)" },
        { "call numbers differ",
          3,
          { x57, x57, x58 },
          NULL,
          2,
          "rank 1: collective check (group 0, call #57): rank 2 issued all_reduce(count 1, f64, "
          "sum) as call #58 while rank 0 issued all_reduce(count 1, f64, sum) as call #57" },
        { "communicators differ",
          2,
          { x, xid },
          NULL,
          1,
          "rank 1: collective check (group 0, call #57): rank 1 issued all_reduce(count 1, f64, "
          "sum) on communicator 000000000000feed while rank 0 issued all_reduce(count 1, f64, "
          "sum) on communicator 1234abcd5678ef00" },
        { "a rank that sent no descriptor",
          2,
          { x, junk },
          NULL,
          1,
          "rank 1: collective check (group 0, call #57): rank 1 issued no collective check (is "
          "BMT_CHECK_COLLECTIVES=1 on every rank?) while rank 0 issued all_reduce(count 1, f64, "
          "sum)" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bmt_error_t err;
        strcpy(err.text, "untouched");
        is_int(comm_desc_first_diff(cases[i].all, cases[i].n), cases[i].first, cases[i].what);
        int rc = comm_desc_check(cases[i].all, cases[i].n, cases[i].members, lead, &err);
        if (cases[i].want == NULL) {
            ok(rc == 0 && strcmp(err.text, "untouched") == 0, "check: %s: agree, err untouched",
               cases[i].what);
        } else {
            ok(rc == -1, "check: %s: -1", cases[i].what);
            is_str(err.text, cases[i].want, cases[i].what);
        }
    }
    bmt_error_t err;
    comm_desc_t d = y, d0 = x;
    ok(comm_desc_mismatch(&err, NULL, &d, 1, 1, &d0, 0) == -1 &&
           strcmp(err.text, "rank 1 issued all_gather(count 4096, bf16) while rank 0 issued "
                            "all_reduce(count 1, f64, sum)") == 0,
       "mismatch without a lead: %s", err.text);
    ok(comm_desc_check(&x, 1, NULL, lead, NULL) == 0, "check: a NULL err is allowed");
}

static void test_flag(void)
{
    struct {
        const char *value; /* NULL: unset */
        int rc;
        bool want;
        const char *msg;
    } cases[] = {
        { NULL, 0, false, NULL },
        { "0", 0, false, NULL },
        { "1", 0, true, NULL },
        /* expected failures */
        { "yes", -1, false, "BMT_CHECK_COLLECTIVES='yes' is not 0 or 1" },
        { "", -1, false, "BMT_CHECK_COLLECTIVES='' is not 0 or 1" },
        { "01", -1, false, "BMT_CHECK_COLLECTIVES='01' is not 0 or 1" },
        { "2", -1, false, "BMT_CHECK_COLLECTIVES='2' is not 0 or 1" },
        { "1 ", -1, false, "BMT_CHECK_COLLECTIVES='1 ' is not 0 or 1" },
        { "true", -1, false, "BMT_CHECK_COLLECTIVES='true' is not 0 or 1" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (cases[i].value)
            setenv("BMT_CHECK_COLLECTIVES", cases[i].value, 1);
        else
            unsetenv("BMT_CHECK_COLLECTIVES");
        bool v = !cases[i].want;
        bmt_error_t err;
        int rc = env_get_flag("BMT_CHECK_COLLECTIVES", &v, &err);
        char what[96];
        snprintf(what, sizeof(what), "BMT_CHECK_COLLECTIVES=%s%s%s", cases[i].value ? "'" : "",
                 cases[i].value ? cases[i].value : "(unset)", cases[i].value ? "'" : "");
        is_int(rc, cases[i].rc, what);
        if (rc == 0)
            ok(v == cases[i].want, "%s reads as %d", what, (int)cases[i].want);
        else
            is_str(err.text, cases[i].msg, what);
    }
    unsetenv("BMT_CHECK_COLLECTIVES");
    const char *d = env_get("BMT_CHECK_COLLECTIVES");
    ok(d && strcmp(d, "0") == 0, "the knob is in the table with default 0");
}

int main(void)
{
    test_make();
    test_format();
    test_check();
    test_flag();
    return done_testing();
}
