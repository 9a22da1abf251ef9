/* tests/plugins/failio.c — an LD_PRELOAD library that makes chosen calls fail,
 * for the tests of error paths that a healthy machine never takes
 * (tests/integration/test_trust.sh):
 *
 *   BMT_TEST_FAIL_FSYNC=TEXT    fsync of a file whose path contains TEXT fails
 *                               with EIO (the others go through)
 *   BMT_TEST_FAIL_FSYNC_DIR=TEXT  fsync of a directory whose path ends with
 *                               TEXT fails with EIO
 *   BMT_TEST_FAIL_MALLOC=SIZE:N the Nth malloc of exactly SIZE bytes returns NULL
 *                               with ENOMEM (each later one goes through)
 *   BMT_TEST_KILL_UNLINK=TEXT   the process kills itself (SIGKILL) right after
 *                               its first unlink of a path containing TEXT
 *                               (a crash in the middle of removing a directory)
 *
 * Not for sanitizer builds (they replace malloc themselves). The real calls are
 * reached without dlsym: the fsync and unlink system calls, and glibc's
 * __libc_malloc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);

__attribute__((visibility("default"))) int fsync(int fd)
{
    const char *want = getenv("BMT_TEST_FAIL_FSYNC"), *dir = getenv("BMT_TEST_FAIL_FSYNC_DIR");
    if ((want && *want) || (dir && *dir)) {
        char link[64], path[4096];
        struct stat st;
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof(path) - 1);
        if (n > 0) {
            path[n] = '\0';
            const size_t d = dir ? strlen(dir) : 0;
            if ((want && *want && strstr(path, want)) ||
                (d && (size_t)n >= d && strcmp(path + n - d, dir) == 0 && fstat(fd, &st) == 0 &&
                 S_ISDIR(st.st_mode))) {
                errno = EIO;
                return -1;
            }
        }
    }
    return (int)syscall(SYS_fsync, fd);
}

__attribute__((visibility("default"))) int unlink(const char *path)
{
    const char *want = getenv("BMT_TEST_KILL_UNLINK");
    int rc = (int)syscall(SYS_unlinkat, AT_FDCWD, path, 0);
    if (rc == 0 && want && *want && strstr(path, want))
        raise(SIGKILL);
    return rc;
}

static size_t fail_size;
static long fail_nth = -1; /* -1: not read yet; 0: off */

__attribute__((visibility("default"))) void *malloc(size_t size)
{
    if (fail_nth < 0) {
        /* getenv allocates nothing */
        const char *v = getenv("BMT_TEST_FAIL_MALLOC");
        unsigned long long s = 0;
        long n = 0;
        fail_nth = v && sscanf(v, "%llu:%ld", &s, &n) == 2 && n > 0 ? n : 0;
        fail_size = (size_t)s;
    }
    if (fail_nth > 0 && size == fail_size && --fail_nth == 0) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(size);
}
