/* tests/progs/behave.c — a rank that misbehaves on purpose, for the supervision tests.
 *
 *   behave [--rank R] ACTION [ARG...]
 * The rank named by --rank (default: every rank) performs ACTION; the others
 * print a line and wait to be ended by bmlaunch. The rank number comes from
 * BMT_RANK, so the plain actions need no PMIx; "abort" and "init" join the job
 * through bmt_init (backend none) first.
 *   exit N          print two lines, exit with status N
 *   signal SIG      print a line, kill itself with signal number SIG
 *   abort N MSG     bmt_init on every rank, then PMIx_Abort(N, MSG) (bmt_abort)
 *   sleep S         sleep S seconds, then exit 0
 *   print N         print N numbered lines to stdout and N to stderr, exit 0
 *   overflow        overflow a signed int (undefined behaviour: a sanitizer build
 *                   with halt_on_error must end the program), else exit 0
 *   ignore-term     ignore SIGTERM and sleep (bmlaunch must SIGKILL it)
 *   catch S [F C]   wait for SIGINT, SIGTERM or SIGHUP; at the first, print "rank R:
 *                   got SIGTERM" (or SIGINT, SIGHUP), take S seconds (a checkpoint, say), print
 * "rank R: handled" and exit 0 (a large S: bmlaunch must SIGKILL it after
 *                   --grace). With F and C, rank F instead exits C one second
 *                   after every rank wrote its pid (BEHAVE_PIDDIR)
 *   fork-sleep      leave a background child that sleeps, then exit 0
 *   env             print the BMT_ and PMIX_RANK variables, exit 0
 *   init            bmt_init (backend none) and print the rank, exit 0
 *   stall           bmt_init (default backend); the --rank rank sleeps while every
 *                   other rank enters a world barrier, which must fail at the
 *                   deadline naming the missing rank (exit 1 after printing it)
 *   fail-until K    (bmlaunch --max-restarts) every rank prints "rank R restart N"
 *                   (N: BMT_RESTART); while N < K the --rank rank exits 1 and the
 *                   others wait to be ended; from restart K on every rank exits 0.
 *                   With BEHAVE_PIDDIR each rank also creates restart.N.R after
 *                   its line, and the failing rank waits (up to 5 s) for all of
 *                   them, so every rank's line is out before the job ends
 * Waiting ranks also write their pid to $BEHAVE_PIDDIR/pid.R when set, so a
 * test can check that none survives.
 */
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bmt/bmt.h"

extern char **environ;

static volatile sig_atomic_t caught;
static void on_signal(int sig) { caught = sig; }

static void note_pid(int rank)
{
    const char *dir = getenv("BEHAVE_PIDDIR");
    if (dir == NULL)
        return;
    char path[512];
    snprintf(path, sizeof(path), "%s/pid.%d", dir, rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
}

/* With BEHAVE_PIDDIR, wait (up to 5 s) until every rank has written its pid, so
 * that a test can afterwards check each of them, however fast the job ends. */
static void await_pids(void)
{
    const char *dir = getenv("BEHAVE_PIDDIR"), *w = getenv("BMT_WORLD_SIZE");
    if (dir == NULL || w == NULL)
        return;
    int world = atoi(w);
    for (int tries = 0; tries < 500; tries++) {
        int n = 0;
        for (int r = 0; r < world; r++) {
            char path[512];
            snprintf(path, sizeof(path), "%s/pid.%d", dir, r);
            n += access(path, F_OK) == 0;
        }
        if (n == world)
            return;
        usleep(10000);
    }
}

static void wait_forever(int rank)
{
    printf("rank %d waiting\n", rank);
    fflush(stdout);
    for (;;)
        pause();
}

/* The fail-until action (see the top of the file). */
static int fail_until(int rank, int target, int k)
{
    const char *n = getenv("BMT_RESTART"), *dir = getenv("BEHAVE_PIDDIR"),
               *w = getenv("BMT_WORLD_SIZE");
    int restart = n ? atoi(n) : -1, world = w ? atoi(w) : 1;
    printf("rank %d restart %d\n", rank, restart);
    fflush(stdout);
    char path[512];
    if (dir) {
        snprintf(path, sizeof(path), "%s/restart.%d.%d", dir, restart, rank);
        FILE *f = fopen(path, "w");
        if (f)
            fclose(f);
    }
    if (restart >= k)
        return 0;
    if (target >= 0 && rank != target)
        wait_forever(rank);
    for (int tries = 0; dir && tries < 500; tries++) {
        int seen = 0;
        for (int r = 0; r < world; r++) {
            snprintf(path, sizeof(path), "%s/restart.%d.%d", dir, restart, r);
            seen += access(path, F_OK) == 0;
        }
        if (seen == world)
            break;
        usleep(10000);
    }
    fprintf(stderr, "rank %d: failing at restart %d (until %d)\n", rank, restart, k);
    return 1;
}

int main(int argc, char **argv)
{
    const char *r = getenv("BMT_RANK");
    int rank = r ? atoi(r) : 0;
    int target = -1;
    int a = 1;
    if (a + 1 < argc && strcmp(argv[a], "--rank") == 0) {
        target = atoi(argv[a + 1]);
        a += 2;
    }
    if (a >= argc) {
        fprintf(stderr, "usage: behave [--rank R] ACTION [ARG...]\n");
        return 64;
    }
    const char *action = argv[a];
    /* ignore-term ignores SIGTERM before its pid is out: a test that sends
     * SIGTERM once every pid is written must find it ignored already */
    if (strcmp(action, "ignore-term") == 0)
        signal(SIGTERM, SIG_IGN);
    note_pid(rank);
    await_pids();
    bmt_ctx_t *ctx = NULL;
    bool stall = strcmp(action, "stall") == 0;
    if (strcmp(action, "abort") == 0 || strcmp(action, "init") == 0 || stall) {
        bmt_config_t cfg = BMT_CONFIG_INITIALIZER;
        cfg.backend = stall ? NULL : "none";
        bmt_error_t err;
        if (bmt_init(&ctx, &cfg, &err) < 0) {
            fprintf(stderr, "behave: %s\n", err.text);
            return 1;
        }
        rank = bmt_rank(ctx);
    }
    if (stall && rank != target) {
        bmt_error_t err;
        if (bmt_barrier(bmt_comm_world(ctx), &err) == 0) {
            fprintf(stderr, "rank %d: the barrier completed without rank %d\n", rank, target);
            return 2;
        }
        fprintf(stderr, "%s\n", err.text);
        bmt_finalize(ctx);
        return 1;
    }
    if (stall)
        wait_forever(rank);
    if (strcmp(action, "fail-until") == 0 && a + 1 < argc)
        return fail_until(rank, target, atoi(argv[a + 1]));
    if (target >= 0 && rank != target)
        wait_forever(rank);

    if (strcmp(action, "exit") == 0 && a + 1 < argc) {
        printf("rank %d about to exit\n", rank);
        fprintf(stderr, "rank %d: exiting with %s\n", rank, argv[a + 1]);
        return atoi(argv[a + 1]);
    }
    if (strcmp(action, "signal") == 0 && a + 1 < argc) {
        printf("rank %d about to die by signal %s\n", rank, argv[a + 1]);
        fflush(stdout);
        kill(getpid(), atoi(argv[a + 1]));
        pause();
    }
    if (strcmp(action, "abort") == 0 && a + 2 < argc) {
        printf("rank %d aborting\n", rank);
        fflush(stdout);
        bmt_abort(ctx, atoi(argv[a + 1]), argv[a + 2]);
        fprintf(stderr, "rank %d: bmt_abort returned\n", rank);
        for (;;)
            pause(); /* the launcher ends us */
    }
    if (strcmp(action, "sleep") == 0 && a + 1 < argc) {
        usleep((useconds_t)(atof(argv[a + 1]) * 1e6));
        return 0;
    }
    if (strcmp(action, "print") == 0 && a + 1 < argc) {
        int n = atoi(argv[a + 1]);
        for (int i = 0; i < n; i++) {
            printf("out %d of rank %d\n", i, rank);
            fprintf(stderr, "err %d of rank %d\n", i, rank);
        }
        return 0;
    }
    if (strcmp(action, "overflow") == 0) {
        /* Undefined behaviour on purpose (signed overflow): under ASAN=1 (with
         * UBSan) and tests/run's UBSAN_OPTIONS it must end the program. */
        volatile int big = INT_MAX;
        int v = big + rank + 1;
        printf("overflowed to %d\n", v);
        return 0;
    }
    if (strcmp(action, "ignore-term") == 0) {
        signal(SIGTERM, SIG_IGN);
        wait_forever(rank);
    }
    if (strcmp(action, "catch") == 0 && a + 1 < argc) {
        sigset_t mask, old;
        sigemptyset(&mask);
        sigaddset(&mask, SIGINT), sigaddset(&mask, SIGTERM), sigaddset(&mask, SIGHUP);
        sigprocmask(SIG_BLOCK, &mask, &old);
        signal(SIGINT, on_signal), signal(SIGTERM, on_signal), signal(SIGHUP, on_signal);
        printf("rank %d waiting for a signal\n", rank);
        fflush(stdout);
        if (a + 3 < argc && rank == atoi(argv[a + 2])) {
            sleep(1);
            fprintf(stderr, "rank %d: exiting with %s\n", rank, argv[a + 3]);
            return atoi(argv[a + 3]);
        }
        while (!caught)
            sigsuspend(&old);
        printf("rank %d: got %s\n", rank,
               caught == SIGINT    ? "SIGINT"
               : caught == SIGTERM ? "SIGTERM"
                                   : "SIGHUP");
        fflush(stdout);
        usleep((useconds_t)(atof(argv[a + 1]) * 1e6));
        printf("rank %d: handled\n", rank);
        return 0;
    }
    if (strcmp(action, "fork-sleep") == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            execlp("sleep", "sleep", "300", (char *)NULL);
            _exit(127);
        }
        printf("rank %d left child %d\n", rank, (int)pid);
        return 0;
    }
    if (strcmp(action, "env") == 0) {
        for (char **e = environ; *e; e++)
            if (strncmp(*e, "BMT_", 4) == 0 || strncmp(*e, "PMIX_RANK=", 10) == 0)
                printf("%s\n", *e);
        return 0;
    }
    if (strcmp(action, "init") == 0) {
        bmt_rank_info_t me = bmt_self(ctx);
        printf("init rank %d group %d group_rank %d world %d\n", me.rank, me.group, me.group_rank,
               bmt_world_size(ctx));
        bmt_finalize(ctx);
        return 0;
    }
    fprintf(stderr, "behave: unknown action '%s'\n", action);
    return 64;
}
