/* launcher/sbatch.h — `bmlaunch --sbatch`: a batch script from a template.
 *
 * Templates are plain, commented batch scripts with {{NAME}} fields
 * (templates/bmt.sbatch). Rendering is pure: every field is replaced by its
 * value, and a line holding a field whose value is empty is left out (so
 * optional #SBATCH lines disappear when their option was not given). A field
 * the renderer does not know is an error, so a typo in a copied template is
 * caught, not submitted.
 */
#ifndef BMT_LAUNCHER_SBATCH_H
#define BMT_LAUNCHER_SBATCH_H

#include <stddef.h>

#include "bmt/error.h"
#include "bmt/layout.h"
#include "cli.h"

typedef struct sbatch_var {
    const char *name;  /* "NODES" for {{NODES}} */
    const char *value; /* "" drops the lines that use it */
} sbatch_var_t;

/* The rendered text (malloc'd), or NULL with err. */
char *sbatch_render(const char *tmpl, const sbatch_var_t *vars, size_t nvars, bmt_error_t *err);

/* arg quoted for a POSIX shell (malloc'd): 'it'\''s' style. */
char *shell_quote(const char *arg);

/* Find the template: given (--template), else $BMT_TEMPLATE_DIR/bmt.sbatch
 * (an error when it is not there), else this bmlaunch's own: PREFIX/share/bmt/
 * templates next to PREFIX/bin, or the source tree's templates/ for build/bin. */
int sbatch_find_template(const char *given, char *path, size_t len, bmt_error_t *err);

/* The batch script for o (a program to run, layout l) as malloc'd text. self is
 * bmlaunch's absolute path, written into the script. */
char *sbatch_script(const launch_opts_t *o, const bmt_layout_t *l, const char *self,
                    bmt_error_t *err);

#endif
