/* plugins/common/prom.c — see prom.h. */
#include "prom.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reserve(prom_buf_t *b, size_t more)
{
    if (b->oom || b->len + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *d = realloc(b->data, cap);
    if (d == NULL) {
        b->oom = true;
        return;
    }
    b->data = d;
    b->cap = cap;
}

void prom_printf(prom_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    reserve(b, (size_t)n);
    if (b->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static void append_escaped(prom_buf_t *b, const char *s, bool quote_too)
{
    for (; *s; s++) {
        if (*s == '\\')
            prom_printf(b, "\\\\");
        else if (*s == '\n')
            prom_printf(b, "\\n");
        else if (*s == '"' && quote_too)
            prom_printf(b, "\\\"");
        else
            prom_printf(b, "%c", *s);
    }
}

void prom_escape_label(const char *in, char *out, size_t len)
{
    size_t k = 0;
    for (; *in && len > 0; in++) {
        const char *rep = *in == '\\' ? "\\\\" : *in == '\n' ? "\\n" : *in == '"' ? "\\\"" : NULL;
        size_t need = rep ? 2 : 1;
        if (k + need + 1 > len)
            break;
        if (rep) {
            out[k++] = rep[0];
            out[k++] = rep[1];
        } else
            out[k++] = *in;
    }
    if (len > 0)
        out[k] = '\0';
}

void prom_value(double v, char *out, size_t len)
{
    if (isnan(v))
        snprintf(out, len, "NaN");
    else if (isinf(v))
        snprintf(out, len, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        snprintf(out, len, "%.0f", v);
    else
        snprintf(out, len, "%.17g", v);
}

bool prom_valid_name(const char *name)
{
    if (name == NULL || *name == '\0')
        return false;
    for (const char *p = name; *p; p++) {
        char c = *p;
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
        if (!alpha && !(p != name && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

void prom_family(prom_buf_t *b, const char *name, const char *type, const char *help)
{
    prom_printf(b, "# HELP %s ", name);
    append_escaped(b, help, false); /* HELP escapes \\ and \n only */
    prom_printf(b, "\n# TYPE %s %s\n", name, type);
}

void prom_sample(prom_buf_t *b, const char *name, const char *const *labels, double value)
{
    prom_printf(b, "%s", name);
    if (labels && labels[0]) {
        prom_printf(b, "{");
        for (int i = 0; labels[i] && labels[i + 1]; i += 2) {
            prom_printf(b, "%s%s=\"", i ? "," : "", labels[i]);
            append_escaped(b, labels[i + 1], true);
            prom_printf(b, "\"");
        }
        prom_printf(b, "}");
    }
    char v[64];
    prom_value(value, v, sizeof(v));
    prom_printf(b, " %s\n", v);
}

void prom_buf_free(prom_buf_t *b)
{
    free(b->data);
    *b = (prom_buf_t){ 0 };
}
