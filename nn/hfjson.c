/* nn/hfjson.c — typed lookups in HF config.json files (see hfjson.h). */
#include "nn/hfjson.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int nn_fail(bmt_error_t *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->text, sizeof(err->text), fmt, ap);
        va_end(ap);
    }
    return -1;
}

nn_json_text_t nn_json_show(const json_t *v)
{
    nn_json_text_t t;
    char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(9));
    snprintf(t.s, sizeof(t.s), "%.37s%s", d ? d : "?", d && strlen(d) > 37 ? "..." : "");
    free(d);
    return t;
}

const char *nn_json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int nn_hf_wrong_type(bmt_error_t *err, const char *file, const char *key, const char *want,
                     const json_t *v)
{
    return nn_fail(err, "%s: malformed: \"%s\" must be %s, not %s", file, key, want,
                   nn_json_kind(v));
}

int nn_hf_unsupported(bmt_error_t *err, const char *file, const char *key, const json_t *v,
                      const char *supported)
{
    return nn_fail(err, "%s: %s is %s; supported: %s", file, key, nn_json_show(v).s, supported);
}

int nn_hf_int(const json_t *root, const char *file, const char *key, const char *alias,
              long long dflt, bool null_is_absent, long long *out, bool *given, bmt_error_t *err)
{
    const json_t *v = json_object_get(root, key), *a = alias ? json_object_get(root, alias) : NULL;
    if (null_is_absent) {
        v = v && json_is_null(v) ? NULL : v;
        a = a && json_is_null(a) ? NULL : a;
    }
    if (v && !json_is_integer(v))
        return nn_hf_wrong_type(err, file, key, "an integer", v);
    if (a && !json_is_integer(a))
        return nn_hf_wrong_type(err, file, alias, "an integer", a);
    if (v && a && json_integer_value(v) != json_integer_value(a))
        return nn_fail(err, "%s: %s is %lld but its alias %s is %lld", file, key,
                       (long long)json_integer_value(v), alias, (long long)json_integer_value(a));
    *given = v || a;
    *out = v ? json_integer_value(v) : a ? json_integer_value(a) : dflt;
    return 0;
}

int nn_hf_number(const json_t *root, const char *file, const char *key, double dflt, double *out,
                 bmt_error_t *err)
{
    const json_t *v = json_object_get(root, key);
    if (v && !json_is_number(v))
        return nn_hf_wrong_type(err, file, key, "a number", v);
    *out = v ? json_number_value(v) : dflt;
    return 0;
}

int nn_hf_bool(const json_t *root, const char *file, const char *key, bool want,
               const char *supported, bmt_error_t *err)
{
    const json_t *v = json_object_get(root, key);
    if (v && !json_is_boolean(v))
        return nn_hf_wrong_type(err, file, key, "true or false", v);
    if (v && json_is_true(v) != want)
        return nn_hf_unsupported(err, file, key, v, supported);
    return 0;
}

int nn_hf_string(const json_t *root, const char *file, const char *key, const char *const *allowed,
                 const char *supported, const char **out, bmt_error_t *err)
{
    const json_t *v = json_object_get(root, key);
    if (out)
        *out = NULL;
    if (v == NULL)
        return 0;
    if (!json_is_string(v))
        return nn_hf_wrong_type(err, file, key, "a string", v);
    for (const char *const *a = allowed; *a; a++)
        if (strcmp(json_string_value(v), *a) == 0) {
            if (out)
                *out = json_string_value(v);
            return 0;
        }
    return nn_hf_unsupported(err, file, key, v, supported);
}

int nn_hf_config_path(const char *path, char *out, size_t len, bmt_error_t *err)
{
    struct stat sb;
    int n;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        n = snprintf(out, len, "%s/config.json", path);
    else {
        const char *slash = strrchr(path, '/');
        n = slash ? snprintf(out, len, "%.*s/config.json", (int)(slash - path), path)
                  : snprintf(out, len, "config.json");
    }
    if (n < 0 || (size_t)n >= len)
        return nn_fail(err, "%s: the path is too long", path);
    return 0;
}

int nn_hf_config_read(const char *file, char **text, bmt_error_t *err)
{
    const size_t max_bytes = 1 << 20; /* HF's are about 1 KiB */
    const char *slash = strrchr(file, '/'), *base = slash ? slash + 1 : file; /* for messages */
    *text = NULL;
    /* O_NONBLOCK: a FIFO (or a device) named config.json must not block the
     * open; fstat refuses every file that is not a regular one below. */
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? 0 : nn_fail(err, "%s: %s", file, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return nn_fail(err, "%s: %s", file, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return nn_fail(err, "%s: not a regular file (a %s is a JSON text file)", file, base);
    }
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        int e = errno;
        close(fd);
        return nn_fail(err, "%s: %s", file, strerror(e));
    }
    char *buf = malloc(max_bytes + 1);
    size_t n = buf ? fread(buf, 1, max_bytes + 1, f) : 0;
    int rc = buf == NULL ? nn_fail(err, "out of memory")
             : ferror(f) ? nn_fail(err, "%s: cannot read: %s", file, strerror(errno))
             : n > max_bytes
                 ? nn_fail(err, "%s: larger than %zu bytes: not a %s", file, max_bytes, base)
             : memchr(buf, 0, n) ? nn_fail(err, "%s: not valid JSON: a NUL byte", file)
                                 : 0;
    fclose(f);
    if (rc < 0) {
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *text = buf;
    return 0;
}

json_t *nn_hf_json_load(const char *text, const char *file, bmt_error_t *err)
{
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        nn_fail(err, "%s: not valid JSON: %.60s (line %d)", file, je.text, je.line);
    return root;
}
