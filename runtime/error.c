/* runtime/error.c — one-line error messages into a caller's bmt_error_t.
 *
 * Messages fit text[BMT_ERROR_TEXT_MAX] (2048 bytes, room for whole paths and
 * names). One that would not keeps its first ELIDE_HEAD bytes and its end,
 * with " ... " between: most messages say what failed first and why last
 * (two long paths used to push the cause off the end), and the reader sees
 * where something was left out. Cuts fall between UTF-8 characters.
 */
#include "error.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ELIDE_HEAD 600
static const char elided[] = " ... ";

static bool utf8_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

/* full (n bytes, more than err->text holds) into err->text: its start, " ... ",
 * and its end. */
static void elide(bmt_error_t *err, const char *full, size_t n)
{
    const size_t cap = sizeof(err->text) - 1, mid = sizeof(elided) - 1;
    size_t head = ELIDE_HEAD;
    while (head > 0 && utf8_cont((unsigned char)full[head]))
        head--;
    size_t from = n - (cap - head - mid);
    while (from < n && utf8_cont((unsigned char)full[from]))
        from++;
    memcpy(err->text, full, head);
    memcpy(err->text + head, elided, mid);
    memcpy(err->text + head + mid, full + from, n - from);
    err->text[head + mid + (n - from)] = '\0';
}

/* err->text = text of n bytes (n may be past what it holds) */
static void put(bmt_error_t *err, const char *text, size_t n)
{
    if (n < sizeof(err->text)) {
        memcpy(err->text, text, n + 1);
        return;
    }
    elide(err, text, n);
}

int errprintf(bmt_error_t *err, const char *fmt, ...)
{
    if (err) {
        char buf[sizeof(err->text)];
        va_list ap, again;
        va_start(ap, fmt);
        va_copy(again, ap);
        int n = vsnprintf(buf, sizeof(buf), fmt, ap);
        if (n < 0) {
            snprintf(err->text, sizeof(err->text), "(an error whose message could not be made)");
        } else if ((size_t)n < sizeof(buf)) {
            memcpy(err->text, buf, (size_t)n + 1);
        } else {
            char *full = malloc((size_t)n + 1);
            if (full != NULL && vsnprintf(full, (size_t)n + 1, fmt, again) == n) {
                put(err, full, (size_t)n);
            } else { /* no memory for the whole: the start, marked */
                memcpy(err->text, buf, sizeof(buf));
                memcpy(err->text + sizeof(err->text) - 4, "...", 4);
            }
            free(full);
        }
        va_end(again);
        va_end(ap);
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
        int np = vsnprintf(prefix, sizeof(prefix), fmt, ap);
        va_end(ap);
        if (np < 0)
            np = 0, prefix[0] = '\0';
        if ((size_t)np >= sizeof(prefix))
            np = (int)sizeof(prefix) - 1;
        memcpy(old, err->text, sizeof(old));
        old[sizeof(old) - 1] = '\0';
        const size_t no = strlen(old);
        char both[2 * sizeof(err->text)];
        memcpy(both, prefix, (size_t)np);
        memcpy(both + np, old, no + 1);
        put(err, both, (size_t)np + no);
    }
    return -1;
}
