/* runtime/error.c — one-line error messages into a caller's bmt_error_t.
 *
 * Messages are truncated to fit text[BMT_ERROR_TEXT_MAX] (2048 bytes, room for
 * whole paths and names); a truncated message ends in "..." so the reader
 * knows there was more.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void mark_truncated(bmt_error_t *err, int n)
{
    if (n >= (int)sizeof(err->text))
        memcpy(err->text + sizeof(err->text) - 4, "...", 4);
}

int errprintf(bmt_error_t *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->text, sizeof(err->text), fmt, ap);
        va_end(ap);
        mark_truncated(err, n);
    }
    return -1;
}

int errprefix(bmt_error_t *err, const char *fmt, ...)
{
    if (err) {
        char prefix[sizeof(err->text)];
        char old[sizeof(err->text)];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof(prefix), fmt, ap);
        va_end(ap);
        memcpy(old, err->text, sizeof(old));
        old[sizeof(old) - 1] = '\0';
        int n = snprintf(err->text, sizeof(err->text), "%s%s", prefix, old);
        mark_truncated(err, n);
    }
    return -1;
}
