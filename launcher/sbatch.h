/* launcher/sbatch.h — `bmlaunch --sbatch`: a batch script from a template.
 *
 * Templates are plain, commented batch scripts with {{NAME}} fields
 * (templates/bmt.sbatch). Rendering is pure: every field is replaced by its
 * value, and a line holding a field whose value is empty is left out (so
 * optional #SBATCH lines disappear when their option was not given). A field
 * the renderer does not know is an error, so a typo in a copied template is
 * caught, not submitted; so is a template without BMLAUNCH, BMLAUNCH_ARGS or
 * PROGRAM (or with one on a line left out), whose script would run nothing.
 */
#ifndef BMT_LAUNCHER_SBATCH_H
#define BMT_LAUNCHER_SBATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "bmt/error.h"
#include "bmt/layout.h"
#include "cli.h"

typedef struct sbatch_var {
    const char *name;  /* "NODES" for {{NODES}} */
    const char *value; /* "" drops the lines that use it */
    bool required;     /* a kept line must use it (the program's line) */
} sbatch_var_t;

/* The rendered text (malloc'd), or NULL with err: an unknown field, '{{'
 * without '}}', a required field the template lacks, or one on a line that an
 * empty field would leave out (a script that runs nothing, and exits 0). */
char *sbatch_render(const char *tmpl, const sbatch_var_t *vars, size_t nvars, bmt_error_t *err);

/* arg quoted for a POSIX shell (malloc'd): 'it'\''s' style. */
char *shell_quote(const char *arg);

/* Find the template: given (--template), else $BMT_TEMPLATE_DIR/bmt.sbatch
 * (an error when it is not there), else this bmlaunch's own: PREFIX/share/bmt/
 * templates next to PREFIX/bin, or the source tree's templates/ for build/bin. */
int sbatch_find_template(const char *given, char *path, size_t len, bmt_error_t *err);

/* The job name when --job-name is not given: the base name of prog with every
 * character but [A-Za-z0-9._-] replaced by '_' (a newline or a space would
 * break the #SBATCH line), at most SBATCH_JOB_NAME_MAX of them, or
 * SBATCH_DEFAULT_JOB_NAME when nothing is left ("./foo/", ""). Writes a
 * NUL-terminated name of at most len - 1 bytes into buf. Pure. */
#define SBATCH_JOB_NAME_MAX 128
#define SBATCH_DEFAULT_JOB_NAME "bmt"
void sbatch_job_name(const char *prog, char *buf, size_t len);

/* Seconds v (finite, >= 0) as a plain decimal ("1000000", "0.00001", "2.5"):
 * no exponent, the shortest digits that read back as v, so bmlaunch's parser
 * (plain decimals only) takes it and gets v again. Returns 0, or -1 when v is
 * negative or not finite or buf (len bytes) is too short; 400 bytes hold any
 * double from 0 to 1e7. Pure. */
int sbatch_seconds(char *buf, size_t len, double v);

/* The batch script for o (a program to run, layout l) as malloc'd text. self is
 * bmlaunch's absolute path, written into the script. */
char *sbatch_script(const launch_opts_t *o, const bmt_layout_t *l, const char *self,
                    bmt_error_t *err);

#endif
