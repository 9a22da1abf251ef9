/* plugins/common/prom.h — Prometheus text exposition format 0.0.4 (pure, no I/O).
 *
 * Writes into a growing buffer: a family's "# HELP" and "# TYPE" lines once,
 * then its samples, with label values escaped (\\, \", \n) and values in the
 * format's spelling (NaN, +Inf, -Inf; integers exactly). bmlaunch's /metrics and
 * the push plugin's Pushgateway mode both write through it; promtool checks the
 * result in tests/integration/test_monitor.sh.
 */
#ifndef BMT_PLUGINS_PROM_H
#define BMT_PLUGINS_PROM_H

#include <stdbool.h>
#include <stddef.h>

#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct prom_buf {
    char *data; /* NUL-terminated */
    size_t len, cap;
    bool oom; /* an append failed: the text is incomplete */
} prom_buf_t;

/* Start a family: name must match [a-zA-Z_:][a-zA-Z0-9_:]*, type is counter,
 * gauge or untyped; help may contain anything (escaped). */
void prom_family(prom_buf_t *b, const char *name, const char *type, const char *help);

/* One sample. labels: NULL, or alternating names and values ending with NULL. */
void prom_sample(prom_buf_t *b, const char *name, const char *const *labels, double value);

/* Printf-style append (for the rare line the helpers do not cover). */
void prom_printf(prom_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Escape a label value into out (len bytes, truncated safely). */
void prom_escape_label(const char *in, char *out, size_t len);

/* A value in the format's spelling into out (at least 32 bytes). */
void prom_value(double v, char *out, size_t len);

bool prom_valid_name(const char *name);

void prom_buf_free(prom_buf_t *b);

#endif
