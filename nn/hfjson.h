/* nn/hfjson.h — reading Hugging Face config.json files, for every model.
 *
 * A model's config.json is its contract with transformers: a trainer reads the
 * one beside the weights and refuses any value it does not compute rather than
 * train another model than the file describes. These helpers give typed
 * lookups with one-line messages that name the file, the key, the value and
 * what is supported; absent keys take the default the caller passes (the
 * transformers config class's, since from_pretrained builds from the same file).
 *
 * Every function returning int returns 0, or -1 with err (may be NULL) set.
 */
#ifndef NN_HFJSON_H
#define NN_HFJSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "bmt/error.h"

/* printf into err->text (when err is not NULL); returns -1. */
int nn_fail(bmt_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A JSON value as text for a message, at most 40 bytes. */
typedef struct nn_json_text {
    char s[48];
} nn_json_text_t;
nn_json_text_t nn_json_show(const json_t *v);

/* "an object", "an integer", ... for messages. */
const char *nn_json_kind(const json_t *v);

/* "FILE: malformed: "KEY" must be WANT, not KIND". */
int nn_hf_wrong_type(bmt_error_t *err, const char *file, const char *key, const char *want,
                     const json_t *v);

/* "FILE: KEY is VALUE; supported: SUPPORTED". */
int nn_hf_unsupported(bmt_error_t *err, const char *file, const char *key, const json_t *v,
                      const char *supported);

/* An integer key, or its alias (HF's attribute_map; NULL for none), with dflt
 * when both are absent or null (null_is_absent) ; -1 when one has another type
 * or they differ. *given says whether either was there. */
int nn_hf_int(const json_t *root, const char *file, const char *key, const char *alias,
              long long dflt, bool null_is_absent, long long *out, bool *given, bmt_error_t *err);

/* A number key (integer or real) with dflt when absent. */
int nn_hf_number(const json_t *root, const char *file, const char *key, double dflt, double *out,
                 bmt_error_t *err);

/* A boolean key that must be `want` when present. */
int nn_hf_bool(const json_t *root, const char *file, const char *key, bool want,
               const char *supported, bmt_error_t *err);

/* A string key that must be one of `allowed` (NULL-terminated) when present;
 * *out (may be NULL) is the value or NULL when absent (borrowed from root). */
int nn_hf_string(const json_t *root, const char *file, const char *key, const char *const *allowed,
                 const char *supported, const char **out, bmt_error_t *err);

/* Where a config.json beside the weights would be: in path when it is a
 * directory, else in path's directory. */
int nn_hf_config_path(const char *path, char *out, size_t len, bmt_error_t *err);

/* config.json's text (malloc'd, NUL-terminated) in *text, or NULL when there is
 * no such file; -1 when it is there but unreadable, not a regular file (a FIFO
 * is refused at once, never waited on), over 1 MiB or has a NUL. Any small JSON
 * file of a model directory reads the same way (generation_config.json): the
 * messages name the file's own name. */
int nn_hf_config_read(const char *file, char **text, bmt_error_t *err);

/* text parsed as a JSON document whose keys are each given once (a repeated
 * one would leave which value counts to the reader): the root (the caller
 * json_decref's it), or NULL and err naming file ("FILE: not valid JSON: ..."). */
json_t *nn_hf_json_load(const char *text, const char *file, bmt_error_t *err);

#endif
