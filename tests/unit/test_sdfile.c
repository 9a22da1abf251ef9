/* tests/unit/test_sdfile.c — launcher/sdfile.c: the file_sd target file of
 * --metrics-sd-file. The rendering is a table of hosts, ports and job ids with
 * the expected text and the expected failures; the writing runs on a temporary
 * directory (atomic rename, an existing file refused and kept, wildcard hosts
 * named, names file_sd does not read refused, nothing left behind on failure,
 * removal). The real
 * Prometheus reading it is in tests/integration/test_alerts.sh.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdfile.h"
#include "tap.h"

static void check_render(void)
{
    static const struct {
        const char *host;
        int port;
        const char *job;
        bool https;
        const char *want;
    } t[] = {
        { "127.0.0.1", 9477, "bmlaunch.n1.42.1700000000", false,
          "[{\"targets\": [\"127.0.0.1:9477\"], \"labels\": {\"job_id\": "
          "\"bmlaunch.n1.42.1700000000\"}}]\n" },
        { "::1", 1, "slurm.7", false,
          "[{\"targets\": [\"[::1]:1\"], \"labels\": {\"job_id\": \"slurm.7\"}}]\n" },
        { "login1", 65535, "a\"b\\c\nd", false,
          "[{\"targets\": [\"login1:65535\"], \"labels\": {\"job_id\": "
          "\"a\\\"b\\\\c\\u000ad\"}}]\n" },
        /* HTTPS: Prometheus takes the scheme from the __scheme__ label. */
        { "node1", 9477, "slurm.8", true,
          "[{\"targets\": [\"node1:9477\"], \"labels\": {\"job_id\": \"slurm.8\", "
          "\"__scheme__\": \"https\"}}]\n" },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char buf[256];
        int n = sdfile_render(t[i].host, t[i].port, t[i].job, t[i].https, buf, sizeof(buf));
        is_str(buf, t[i].want, "rendered");
        is_int(n, (long long)strlen(t[i].want), "its length");
    }
    /* Expected failures: an impossible port, a buffer too small by one. */
    static const struct {
        int port;
        size_t len;
        const char *why;
    } bad[] = {
        { 0, 256, "port 0" },           { 65536, 256, "port 65536" },
        { -1, 256, "port -1" },         { 9477, 63, "one byte short of the text and its NUL" },
        { 9477, 10, "a small buffer" }, { 9477, 0, "no buffer" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char buf[256] = "x";
        int n = sdfile_render("127.0.0.1", bad[i].port, "job", false, buf, bad[i].len);
        ok(n == -1 && (bad[i].len == 0 || buf[0] == '\0'), "refused: %s", bad[i].why);
    }
    char buf[64];
    ok(sdfile_render("127.0.0.1", 9477, "job", false, buf, sizeof(buf)) == 63,
       "the same text fits in 64 bytes");
}

/* The certificate's file beside the target file: the ending file_sd matches
 * goes, ".ca.pem" comes. */
static void check_ca_path(void)
{
    static const struct {
        const char *sd, *want;
    } t[] = {
        { "/srv/sd/job.json", "/srv/sd/job.ca.pem" },
        { "/srv/sd/job.yml", "/srv/sd/job.ca.pem" },
        { "/srv/sd/job.yaml", "/srv/sd/job.ca.pem" },
        { "job", "job.ca.pem" },
        { "/srv/sd/.json", "/srv/sd/.json.ca.pem" },
        { "a.json.bak", "a.json.bak.ca.pem" },
        /* endings in any case, as the target file's name is taken */
        { "/srv/sd/job.JSON", "/srv/sd/job.ca.pem" },
        { "job.Yaml", "job.ca.pem" },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char buf[64];
        ok(sdfile_ca_path(t[i].sd, buf, sizeof(buf)) == 0, "ca path of %s", t[i].sd);
        is_str(buf, t[i].want, "ca path");
    }
    char small[8] = "x";
    ok(sdfile_ca_path("/srv/sd/job.json", small, sizeof(small)) == -1 && small[0] == '\0',
       "refused: does not fit");
}

static char *slurp(const char *path)
{
    static char text[4096];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

static int entries(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls -A '%s' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

static void check_write(void)
{
    char dir[] = "/tmp/bmt-sdfile.XXXXXX";
    if (mkdtemp(dir) == NULL) {
        ok(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    char path[512], sub[512];
    snprintf(path, sizeof(path), "%s/targets.json", dir);
    bmt_error_t err = { { 0 } };
    ok(sdfile_write(path, "127.0.0.1", 9500, "job-1", false, &err) == 0, "written (%s)", err.text);
    const char *text = slurp(path);
    is_str(text ? text : "(none)",
           "[{\"targets\": [\"127.0.0.1:9500\"], \"labels\": {\"job_id\": \"job-1\"}}]\n",
           "the file holds the target");
    struct stat st;
    ok(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644, "readable by Prometheus (0644)");
    /* The path is the job's own: one that exists is another job's, refused. */
    memset(&err, 0, sizeof(err));
    ok(sdfile_write(path, "127.0.0.1", 9501, "job-2", false, &err) == -1 &&
           strstr(err.text, "exists") && strstr(err.text, path),
       "an existing file (another job's) is refused: %s", err.text);
    text = slurp(path);
    ok(text && strstr(text, "9500") && strstr(text, "job-1"), "and left as it was");
    is_int(entries(dir), 1, "no temporary file left beside it");
    snprintf(sub, sizeof(sub), "%s/targets.ca.pem", dir);
    ok(sdfile_write_text(sub, SDFILE_WHAT, "a", 1, &err) == 0 &&
           sdfile_write_text(sub, SDFILE_WHAT, "b", 1, &err) == -1 && strstr(err.text, "exists"),
       "so is the certificate beside it: %s", err.text);
    text = slurp(sub);
    ok(text && strcmp(text, "a") == 0, "and it is left as it was");
    text = sdfile_write_text(sub, "--log-dir", "c", 1, &err) == 0 ? slurp(sub) : NULL;
    ok(text && strcmp(text, "c") == 0, "another file (--log-dir's copy) is replaced");
    unlink(sub);
    snprintf(sub, sizeof(sub), "%s/link.json", dir);
    ok(symlink("/nonexistent", sub) == 0 &&
           sdfile_write(sub, "127.0.0.1", 9500, "j", false, &err) == -1 &&
           strstr(err.text, "exists"),
       "a dangling symbolic link is refused too: %s", err.text);
    unlink(sub);
    /* The temporary name is predictable (PATH.tmp.PID) and the directory may
     * be shared: a link planted there is not written through. */
    char victim[512], tmp[600];
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    snprintf(sub, sizeof(sub), "%s/planted.json", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", sub, (long)getpid());
    FILE *vf = fopen(victim, "w");
    if (vf)
        fputs("precious\n", vf), fclose(vf);
    memset(&err, 0, sizeof(err));
    ok(symlink(victim, tmp) == 0 && sdfile_write(sub, "127.0.0.1", 9500, "j", false, &err) == -1 &&
           strstr(err.text, tmp),
       "a link at the temporary name is refused: %s", err.text);
    text = slurp(victim);
    ok(text && strcmp(text, "precious\n") == 0 && access(sub, F_OK) != 0,
       "and not written through (the file it points to is unchanged, no target file)");
    snprintf(sub, sizeof(sub), "%s/planted.pem", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", sub, (long)getpid());
    ok(symlink(victim, tmp) == 0 && sdfile_write_text(sub, "--log-dir", "x", 1, &err) == -1,
       "nor for --log-dir's copy: %s", err.text);
    text = slurp(victim);
    ok(text && strcmp(text, "precious\n") == 0, "which leaves it unchanged too");
    unlink(tmp);
    snprintf(tmp, sizeof(tmp), "%s/planted.json.tmp.%ld", dir, (long)getpid());
    unlink(tmp);
    unlink(victim);
    /* A wildcard address is never a target: this host's name is. */
    char host[256] = "", want[600];
    gethostname(host, sizeof(host) - 1);
    snprintf(want, sizeof(want), "[{\"targets\": [\"%s:9502\"]", host);
    static const char *const wild[] = { "0.0.0.0", "::", "::0", "0:0:0:0:0:0:0:0" };
    for (size_t i = 0; i < sizeof(wild) / sizeof(wild[0]); i++) {
        snprintf(sub, sizeof(sub), "%s/w.json", dir);
        memset(&err, 0, sizeof(err));
        int rc = sdfile_write(sub, wild[i], 9502, "j", false, &err);
        text = rc == 0 ? slurp(sub) : NULL;
        ok(text && strncmp(text, want, strlen(want)) == 0,
           "wildcard %s: the host's name is the target (%s)", wild[i], err.text);
        unlink(sub);
    }

    /* Expected failures: each names the path and the cause, leaves nothing. */
    snprintf(sub, sizeof(sub), "%s/no/such/dir/t.json", dir);
    memset(&err, 0, sizeof(err));
    ok(sdfile_write(sub, "127.0.0.1", 9500, "j", false, &err) == -1 && strstr(err.text, sub) &&
           strstr(err.text, "No such file or directory"),
       "a missing directory is refused: %s", err.text);
    memset(&err, 0, sizeof(err));
    ok(sdfile_write(dir, "127.0.0.1", 9500, "j", false, &err) == -1 &&
           strstr(err.text, "is a directory"),
       "a directory is refused: %s", err.text);
    memset(&err, 0, sizeof(err));
    ok(sdfile_write(path, "127.0.0.1", 0, "j", false, &err) == -1 && strstr(err.text, path),
       "an impossible target is refused: %s", err.text);
    text = slurp(path);
    ok(text && strstr(text, "9500"), "and the file is unchanged");
    /* Names file_sd never reads: the file would be written for nothing. */
    static const char *const names[] = { "t", "t.txt", "t.json.tmp", "t.json/" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(sub, sizeof(sub), "%s/%s", dir, names[i]);
        memset(&err, 0, sizeof(err));
        ok(sdfile_write(sub, "127.0.0.1", 9500, "j", false, &err) == -1 &&
               strstr(err.text, "end in .json, .yml or .yaml"),
           "a name file_sd does not read is refused: %s", err.text);
    }
    snprintf(sub, sizeof(sub), "%s/t.YAML", dir);
    ok(sdfile_write(sub, "127.0.0.1", 9500, "j", false, &err) == 0, "t.YAML is taken (%s)",
       err.text);
    unlink(sub);
    if (geteuid() != 0) { /* root writes anywhere */
        snprintf(sub, sizeof(sub), "%s/ro", dir);
        mkdir(sub, 0555);
        snprintf(sub, sizeof(sub), "%s/ro/t.json", dir);
        memset(&err, 0, sizeof(err));
        ok(sdfile_write(sub, "127.0.0.1", 9500, "j", false, &err) == -1 &&
               strstr(err.text, "Permission denied"),
           "a directory without write permission is refused: %s", err.text);
        snprintf(sub, sizeof(sub), "%s/ro", dir);
        rmdir(sub);
    }
    is_int(entries(dir), 1, "no temporary file left by the failures");

    sdfile_remove(path);
    ok(access(path, F_OK) != 0, "removed");
    sdfile_remove(path);
    sdfile_remove(NULL);
    ok(1, "removing it again, or NULL, is a no-op");
    rmdir(dir);
}

int main(void)
{
    check_render();
    check_ca_path();
    check_write();
    return done_testing();
}
