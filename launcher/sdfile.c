/* launcher/sdfile.c — the file_sd target file of --metrics-sd-file (sdfile.h).
 *
 * Prometheus's file discovery watches the file's directory with inotify and
 * rereads it on every change: the file is written under a temporary name in
 * the same directory (same file system, so rename is atomic) and renamed to
 * the target, never rewritten in place; the target must not exist (it would be
 * another job's). Layer: launcher only.
 */
#include "sdfile.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

/* Append s to buf as the inside of a JSON string; false when it does not fit. */
static bool json_put_str(char *buf, size_t len, size_t *k, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\')
            snprintf(esc, sizeof(esc), "\\%c", *p);
        else if (*p < 0x20)
            snprintf(esc, sizeof(esc), "\\u%04x", *p);
        else
            esc[0] = (char)*p, esc[1] = '\0';
        size_t n = strlen(esc);
        if (*k + n >= len)
            return false;
        memcpy(buf + *k, esc, n);
        *k += n;
    }
    buf[*k] = '\0';
    return true;
}

int sdfile_render(const char *host, int port, const char *job_id, bool https, char *buf, size_t len)
{
    if (len == 0)
        return -1;
    buf[0] = '\0';
    if (port < 1 || port > 65535)
        return -1;
    bool v6 = strchr(host, ':') != NULL;
    size_t k = 0;
    int n = snprintf(buf, len, "[{\"targets\": [\"%s", v6 ? "[" : "");
    if (n < 0 || (size_t)n >= len)
        goto full;
    k = (size_t)n;
    if (!json_put_str(buf, len, &k, host))
        goto full;
    n = snprintf(buf + k, len - k, "%s:%d\"], \"labels\": {\"job_id\": \"", v6 ? "]" : "", port);
    if (n < 0 || (size_t)n >= len - k)
        goto full;
    k += (size_t)n;
    if (!json_put_str(buf, len, &k, job_id))
        goto full;
    n = snprintf(buf + k, len - k, "\"%s}}]\n", https ? ", \"__scheme__\": \"https\"" : "");
    if (n < 0 || (size_t)n >= len - k)
        goto full;
    return (int)(k + (size_t)n);
full:
    buf[0] = '\0';
    return -1;
}

/* Does path end in a name that Prometheus's file_sd reads (.json, .yml, .yaml,
 * in any case)? Its file patterns must end so, and it parses by the ending. */
static bool sd_name_ok(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    return dot && (strcasecmp(dot, ".json") == 0 || strcasecmp(dot, ".yml") == 0 ||
                   strcasecmp(dot, ".yaml") == 0);
}

/* Put tmp in place at path. replace: over whatever path is; else only where
 * nothing is (atomically: renameat2 RENAME_NOREPLACE, or link() where the file
 * system lacks it). Returns 0 or an errno (EEXIST: path exists). */
static int publish(const char *tmp, const char *path, bool replace)
{
    if (replace)
        return rename(tmp, path) == 0 ? 0 : errno;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != EPERM)
        return errno;
    if (link(tmp, path) != 0)
        return errno;
    unlink(tmp);
    return 0;
}

int sdfile_write_text(const char *path, const char *what, const char *text, size_t n,
                      bmt_error_t *err)
{
    /* The files of --metrics-sd-file belong to one job: one that exists is
     * another job's (or left by a job killed with SIGKILL), and replacing it
     * would hide that job from Prometheus and remove its file at our exit. */
    bool replace = strcmp(what, SDFILE_WHAT) != 0;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return errprintf(err, "%s %.200s is a directory; name a file in it", what, path);
    char tmp[4200];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return errprintf(err, "%s: the path is too long (%zu bytes)", what, strlen(path));
    /* A new file, never one that is there: in a directory that other users
     * write too (one Prometheus watches for every job), a link planted at
     * this predictable name would have us write through it. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return errprintf(err, "%s %.200s: cannot create %.200s: %s", what, path, tmp,
                         strerror(errno));
    ssize_t w = write(fd, text, n);
    int e = w == (ssize_t)n ? 0 : w < 0 ? errno : EIO;
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e == 0)
        e = publish(tmp, path, replace);
    if (e != 0) {
        unlink(tmp);
        if (e == EEXIST)
            return errprintf(
                err,
                "%s %.200s exists: it is another job's, or a job that was killed left it "
                "behind; remove it if no running job uses it, or name a file of "
                "this job's own",
                what, path);
        return errprintf(err, "%s %.200s: cannot write it: %s", what, path, strerror(e));
    }
    return 0;
}

bool sdfile_unspecified(const char *addr)
{
    unsigned char a[16];
    static const unsigned char zero[16];
    return (inet_pton(AF_INET, addr, a) == 1 && memcmp(a, zero, 4) == 0) ||
           (inet_pton(AF_INET6, addr, a) == 1 && memcmp(a, zero, 16) == 0);
}

int sdfile_write(const char *path, const char *host, int port, const char *job_id, bool https,
                 bmt_error_t *err)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return errprintf(err, "%s %.200s is a directory; name a file in it", SDFILE_WHAT, path);
    if (!sd_name_ok(path))
        return errprintf(err,
                         "--metrics-sd-file %.200s: Prometheus's file_sd reads only files "
                         "whose names end in .json, .yml or .yaml; name it e.g. %.200s.json",
                         path, path);
    /* A wildcard address is no target: a Prometheus elsewhere would scrape
     * itself. This host's name is. */
    char name[256];
    if (sdfile_unspecified(host)) {
        if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0')
            return errprintf(err,
                             "--metrics-sd-file %.200s: the collector listens on %.100s, a "
                             "wildcard, and this host has no name to give Prometheus; name an "
                             "address with --metrics-bind",
                             path, host);
        name[sizeof(name) - 1] = '\0';
        host = name;
    }
    char text[1024];
    int n = sdfile_render(host, port, job_id, https, text, sizeof(text));
    if (n < 0)
        return errprintf(err,
                         "--metrics-sd-file %.200s: the target %.200s:%d of job %.200s does "
                         "not fit in the file's 1 KiB",
                         path, host, port, job_id);
    return sdfile_write_text(path, SDFILE_WHAT, text, (size_t)n, err);
}

int sdfile_ca_path(const char *path, char *buf, size_t len)
{
    size_t n = strlen(path);
    static const char *const ends[] = { ".json", ".yaml", ".yml" };
    for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) {
        size_t e = strlen(ends[i]);
        /* in any case, as sd_name_ok takes them */
        if (n > e && strcasecmp(path + n - e, ends[i]) == 0 && path[n - e - 1] != '/') {
            n -= e;
            break;
        }
    }
    int w = snprintf(buf, len, "%.*s.ca.pem", (int)n, path);
    if (w < 0 || (size_t)w >= len) {
        if (len)
            buf[0] = '\0';
        return -1;
    }
    return 0;
}

void sdfile_remove(const char *path)
{
    if (path)
        unlink(path);
}
