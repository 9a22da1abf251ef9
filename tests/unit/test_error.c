/* tests/unit/test_error.c — runtime/error.c: messages that fit are kept
 * whole; one that would overflow keeps its start and its end (the cause) with
 * " ... " between, cut between UTF-8 characters; errprefix likewise. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tap.h"

static bool utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int n = *p < 0x80             ? 0
                : (*p & 0xE0) == 0xC0 ? 1
                : (*p & 0xF0) == 0xE0 ? 2
                : (*p & 0xF8) == 0xF0 ? 3
                                      : -1;
        if (n < 0)
            return false;
        p++;
        for (int i = 0; i < n; i++, p++)
            if ((*p & 0xC0) != 0x80)
                return false;
    }
    return true;
}

int main(void)
{
    bmt_error_t err;
    /* fits: whole */
    ok(errprintf(&err, "rank %d: %s", 3, "cannot open x") == -1 &&
           strcmp(err.text, "rank 3: cannot open x") == 0,
       "a message that fits is kept whole: '%s'", err.text);
    char exact[BMT_ERROR_TEXT_MAX];
    memset(exact, 'a', sizeof(exact) - 1);
    exact[sizeof(exact) - 1] = '\0';
    errprintf(&err, "%s", exact);
    ok(strcmp(err.text, exact) == 0, "one of exactly %d bytes is kept whole",
       BMT_ERROR_TEXT_MAX - 1);

    /* two long paths, then the cause: the cause survives */
    char path[1500];
    memset(path, 'p', sizeof(path) - 1);
    path[sizeof(path) - 1] = '\0';
    errprintf(&err, "%s/%s: cannot write: No space left on device", path, path);
    size_t n = strlen(err.text);
    const char *tail = ": cannot write: No space left on device";
    ok(n == BMT_ERROR_TEXT_MAX - 1 && strncmp(err.text, "ppp", 3) == 0 &&
           strstr(err.text, "p ... p") != NULL && strcmp(err.text + n - strlen(tail), tail) == 0,
       "an overflowing message keeps its start, ' ... ' and its end (%zu bytes, ends '%s')", n,
       err.text + n - 20);

    /* cuts between UTF-8 characters: a text of 3-byte characters */
    char *wide = malloc(3 * 2000 + 1);
    for (int i = 0; i < 2000; i++)
        memcpy(wide + 3 * i, "\xe2\x82\xac", 3); /* U+20AC */
    wide[3 * 2000] = '\0';
    errprintf(&err, "x%sEND", wide);
    n = strlen(err.text);
    ok(utf8_valid(err.text) && n < BMT_ERROR_TEXT_MAX && strstr(err.text, " ... ") != NULL &&
           strcmp(err.text + n - 3, "END") == 0,
       "cuts fall between UTF-8 characters (%zu bytes, valid UTF-8)", n);

    /* errprefix: a long prefix before a long message keeps the message's end */
    errprintf(&err, "%s: the cause", path);
    errprefix(&err, "%s: ", path);
    n = strlen(err.text);
    ok(n == BMT_ERROR_TEXT_MAX - 1 && strcmp(err.text + n - 11, ": the cause") == 0 &&
           strstr(err.text, " ... ") != NULL,
       "errprefix over a long message keeps the cause at its end");
    errprintf(&err, "inner");
    errprefix(&err, "block %s: ", "h.3");
    ok(strcmp(err.text, "block h.3: inner") == 0, "errprefix that fits: '%s'", err.text);
    free(wide);
    return done_testing();
}
