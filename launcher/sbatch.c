/* launcher/sbatch.c — render batch scripts from templates (see sbatch.h).
 *
 * The script runs bmlaunch itself on the first node of the allocation; bmlaunch
 * sees SLURM_JOB_ID, plans the same layout and starts the ranks with srun. So a
 * batch job and an interactive `salloc ... bmlaunch ...` behave the same, and
 * the template stays a short shell script a user can read and copy.
 */
#include "sbatch.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "env.h"
#include "error.h"
#include "tlscert.h"

/* A growing string. */
typedef struct buf {
    char *s;
    size_t len, cap;
    int bad;
} buf_t;

static void put(buf_t *b, const char *s, size_t n)
{
    if (b->bad)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (ns == NULL) {
            b->bad = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

int sbatch_seconds(char *buf, size_t len, double v)
{
    /* The shortest %e form that reads back as v gives the significant digits
     * and the exponent; they are then written out without the exponent, which
     * bmlaunch's parser refuses (1e+06, 1e-05 are what %g would print). */
    if (!(v >= 0) || !isfinite(v) || len < 2)
        return -1;
    if (v == 0) {
        snprintf(buf, len, "0");
        return 0;
    }
    char e[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec, v);
        if (strtod(e, NULL) == v)
            break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd + 1 < sizeof(digits))
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') /* 1.50e+00: the zeros say nothing */
        nd--;
    const long point = (*p == 'e' ? strtol(p + 1, NULL, 10) : 0) + 1; /* digits before '.' */
    /* "0.000ddd", "ddd000" or "dd.ddd": its length first, so it fits or fails whole. */
    const size_t zeros = point <= 0 ? (size_t)-point : (size_t)point > nd ? (size_t)point - nd : 0;
    const size_t need = nd + zeros + (point <= 0 ? 2 : (size_t)point < nd ? 1 : 0);
    if (need + 1 > len)
        return -1;
    size_t o = 0;
    if (point <= 0) {
        buf[o++] = '0';
        buf[o++] = '.';
        memset(buf + o, '0', zeros);
        o += zeros;
        memcpy(buf + o, digits, nd);
        o += nd;
    } else if ((size_t)point >= nd) {
        memcpy(buf + o, digits, nd);
        o += nd;
        memset(buf + o, '0', zeros);
        o += zeros;
    } else {
        memcpy(buf + o, digits, (size_t)point);
        o += (size_t)point;
        buf[o++] = '.';
        memcpy(buf + o, digits + point, nd - (size_t)point);
        o += nd - (size_t)point;
    }
    buf[o] = '\0';
    return 0;
}

/* " NAME VALUE" for a number of seconds, as a plain decimal that bmlaunch's
 * parser reads back to the same double. */
static void put_seconds(buf_t *b, const char *name, double v)
{
    char num[400]; /* the smallest double bmlaunch takes has 300-odd decimals */
    if (sbatch_seconds(num, sizeof(num), v) < 0) {
        b->bad = 1;
        return;
    }
    put(b, " ", 1);
    put(b, name, strlen(name));
    put(b, " ", 1);
    put(b, num, strlen(num));
}

void sbatch_job_name(const char *prog, char *buf, size_t len)
{
    /* The program's base name, but only the characters sbatch and the script
     * take as they are: a newline would end the #SBATCH line (the rest a shell
     * command, and sbatch stops reading directives there), a space breaks
     * sbatch's parsing. */
    const char *base = strrchr(prog, '/') ? strrchr(prog, '/') + 1 : prog;
    size_t o = 0;
    for (const char *p = base; *p && o + 1 < len && o < SBATCH_JOB_NAME_MAX; p++) {
        const char c = *p;
        const bool safe = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        buf[o++] = safe ? c : '_';
    }
    buf[o] = '\0';
    if (o == 0)
        snprintf(buf, len, "%s", SBATCH_DEFAULT_JOB_NAME);
}

/* " NAME 'VALUE'": an option whose value is shell-quoted. */
static void put_quoted(buf_t *b, const char *name, const char *value)
{
    char *q = shell_quote(value);
    put(b, " ", 1);
    put(b, name, strlen(name));
    put(b, " ", 1);
    if (q == NULL)
        b->bad = 1;
    else
        put(b, q, strlen(q));
    free(q);
}

static const sbatch_var_t *lookup(const sbatch_var_t *v, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(v[i].name) == len && strncmp(v[i].name, name, len) == 0)
            return &v[i];
    return NULL;
}

char *sbatch_render(const char *tmpl, const sbatch_var_t *vars, size_t nvars, bmt_error_t *err)
{
    /* Per field: whether this line uses it, and whether a kept line did. */
    bool *used = calloc(nvars + 1, sizeof(bool));
    bool *kept = calloc(nvars + 1, sizeof(bool));
    if (used == NULL || kept == NULL) {
        free(used);
        free(kept);
        errprintf(err, "out of memory rendering the batch script");
        return NULL;
    }
    buf_t out = { 0 };
    int lineno = 0;
    const char *line = tmpl;
    while (*line) {
        lineno++;
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) + 1 : strlen(line);
        buf_t l = { 0 };
        const sbatch_var_t *empty = NULL;  /* the first empty field of this line */
        const sbatch_var_t *needed = NULL; /* the first required field of this line */
        memset(used, 0, nvars * sizeof(bool));
        const char *p = line, *end = line + len;
        while (p < end) {
            const char *open = p;
            while (open + 1 < end && !(open[0] == '{' && open[1] == '{'))
                open++;
            if (open + 1 >= end) {
                put(&l, p, (size_t)(end - p));
                break;
            }
            put(&l, p, (size_t)(open - p));
            const char *close = open + 2;
            while (close + 1 < end && !(close[0] == '}' && close[1] == '}'))
                close++;
            if (close + 1 >= end) {
                free(l.s);
                free(out.s);
                free(used);
                free(kept);
                errprintf(err, "template line %d: '{{' without '}}'", lineno);
                return NULL;
            }
            const sbatch_var_t *v = lookup(vars, nvars, open + 2, (size_t)(close - open - 2));
            if (v == NULL) {
                int n = (int)(close - open - 2);
                free(l.s);
                free(out.s);
                free(used);
                free(kept);
                errprintf(err, "template line %d: unknown field {{%.*s}}", lineno, n > 40 ? 40 : n,
                          open + 2);
                return NULL;
            }
            used[v - vars] = true;
            if (v->value == NULL || v->value[0] == '\0') {
                if (empty == NULL)
                    empty = v;
            } else
                put(&l, v->value, strlen(v->value));
            if (v->required && needed == NULL)
                needed = v;
            p = close + 2;
        }
        if (empty && needed) {
            /* Dropping it would drop what the script is for (the program): a
             * script that exits 0 having run nothing. */
            free(l.s);
            free(out.s);
            free(used);
            free(kept);
            errprintf(err,
                      "template line %d: {{%s}} is empty here, which leaves the line out, and "
                      "with it {{%s}}, without which the script runs nothing; put {{%s}} on a "
                      "line of its own",
                      lineno, empty->name, needed->name, empty->name);
            return NULL;
        }
        if (empty == NULL) {
            if (l.len)
                put(&out, l.s, l.len);
            for (size_t i = 0; i < nvars; i++)
                kept[i] |= used[i];
        }
        if (l.bad)
            out.bad = 1;
        free(l.s);
        line += len;
    }
    for (size_t i = 0; i < nvars; i++) {
        if (vars[i].required && !kept[i]) {
            free(out.s);
            free(used);
            free(kept);
            errprintf(err,
                      "the template has no {{%s}}: the script would not run the program given; "
                      "keep the line exec {{BMLAUNCH}} {{BMLAUNCH_ARGS}} -- {{PROGRAM}}",
                      vars[i].name);
            return NULL;
        }
    }
    free(used);
    free(kept);
    if (out.bad || out.s == NULL) {
        free(out.s);
        errprintf(err, "out of memory rendering the batch script");
        return NULL;
    }
    return out.s;
}

char *shell_quote(const char *arg)
{
    buf_t b = { 0 };
    put(&b, "'", 1);
    for (const char *p = arg; *p; p++) {
        if (*p == '\'')
            put(&b, "'\\''", 4);
        else
            put(&b, p, 1);
    }
    put(&b, "'", 1);
    if (b.bad) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

static int readable(const char *path) { return access(path, R_OK) == 0; }

int sbatch_find_template(const char *given, char *path, size_t len, bmt_error_t *err)
{
    if (given) {
        if (!readable(given))
            return errprintf(err, "--template %.200s: %s", given, strerror(errno));
        snprintf(path, len, "%s", given);
        return 0;
    }
    const char *dir = env_get("BMT_TEMPLATE_DIR");
    if (dir) {
        snprintf(path, len, "%s/bmt.sbatch", dir);
        if (readable(path))
            return 0;
        int e = errno;
        return errprintf(err,
                         "BMT_TEMPLATE_DIR=%.200s: %.200s/bmt.sbatch: %s; put the template there, "
                         "or unset BMT_TEMPLATE_DIR for the installed one",
                         dir, dir, strerror(e));
    }
    /* The template of this bmlaunch: PREFIX/share/bmt/templates when installed
     * as PREFIX/bin/bmlaunch, the source tree's templates/ when run from
     * build/bin (never another installation's). */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
    if (slash == NULL)
        return errprintf(err, "cannot find bmlaunch's own path (/proc/self/exe) to find the "
                              "installed batch template; give --template FILE");
    *slash = '\0';
    snprintf(path, len, "%s/../share/bmt/templates/bmt.sbatch", exe);
    if (readable(path))
        return 0;
    snprintf(path, len, "%s/../../templates/bmt.sbatch", exe);
    if (readable(path))
        return 0;
    return errprintf(err,
                     "no batch template found: neither %.200s/../share/bmt/templates/bmt.sbatch "
                     "(installed) nor %.200s/../../templates/bmt.sbatch (the source tree) is "
                     "readable; give --template FILE",
                     exe, exe);
}

static char *read_file(const char *path, bmt_error_t *err)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        errprintf(err, "cannot read %.200s: %s", path, strerror(errno));
        return NULL;
    }
    buf_t b = { 0 };
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        put(&b, chunk, n);
    int bad = ferror(f) || b.bad || b.s == NULL || b.len > (1 << 20);
    fclose(f);
    if (bad) {
        free(b.s);
        errprintf(err, "cannot read %.200s (empty, unreadable or over 1 MiB)", path);
        return NULL;
    }
    /* The text ends at a NUL: what follows (the exec line) would be lost
     * without a word, and the script would run nothing. */
    const char *nul = memchr(b.s, '\0', b.len);
    if (nul) {
        errprintf(err, "%.200s holds a NUL byte at offset %zu: not a text file (damaged?)", path,
                  (size_t)(nul - b.s));
        free(b.s);
        return NULL;
    }
    return b.s;
}

char *sbatch_script(const launch_opts_t *o, const bmt_layout_t *l, const char *self,
                    bmt_error_t *err)
{
    char path[PATH_MAX];
    if (sbatch_find_template(o->template_path, path, sizeof(path), err) < 0)
        return NULL;
    char *tmpl = read_file(path, err);
    if (tmpl == NULL)
        return NULL;
    const bool cuda = strcmp(o->device, "cuda") == 0;
    const char *backend = o->backend ? o->backend : cuda ? "nccl" : "shm";
    if (strcmp(backend, "shm") == 0 && l->nodes > 1) {
        free(tmpl);
        errprintf(err,
                  "--device cpu uses the shm backend, which needs every rank on one node, but "
                  "this layout spans %d nodes of %d ranks: put the %d ranks on one node "
                  "(--gpus-per-node %d), use --device cuda, or --backend none for a program "
                  "that does not communicate through bmt",
                  l->nodes, l->gpus_per_node, l->world, l->world);
        return NULL;
    }
    char nodes[16], tpn[16], gpn[16], lead[16], ntasks[16];
    snprintf(ntasks, sizeof(ntasks), "%d", l->world);
    snprintf(nodes, sizeof(nodes), "%d", l->nodes);
    snprintf(tpn, sizeof(tpn), "%d", l->gpus_per_node);
    snprintf(gpn, sizeof(gpn), "%d", cuda ? l->gpus_per_node : 0);
    snprintf(lead, sizeof(lead), "%d", o->signal_lead);
    char name[SBATCH_JOB_NAME_MAX + 1];
    sbatch_job_name(o->prog_argv[0], name, sizeof(name));

    /* bmlaunch's own options: every one this command line gave that matters
     * inside the job (not the batch-script ones), so the bmlaunch in the script
     * parses to the same options (tests/unit/test_slurm.c compares them one by
     * one). The layout is given whole, so it cannot be derived differently
     * inside the allocation. */
    launch_opts_t def;
    bmt_error_t ignored;
    char *dargv[] = { "bmlaunch", "--", "x", NULL };
    if (cli_parse(3, dargv, &def, &ignored) != 0) {
        free(tmpl);
        errprintf(err, "internal error: bmlaunch's defaults do not parse");
        return NULL;
    }
    buf_t args = { 0 }, program = { 0 };
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "--groups %d --gpus-per-group %d --gpus-per-node %d --device %s",
             l->groups, l->gpus_per_group, l->gpus_per_node, o->device);
    put(&args, tmp, strlen(tmp));
    if (o->nodes > 0) {
        snprintf(tmp, sizeof(tmp), " --nodes %d", o->nodes);
        put(&args, tmp, strlen(tmp));
    }
    if (o->backend) {
        snprintf(tmp, sizeof(tmp), " --backend %s", o->backend);
        put(&args, tmp, strlen(tmp));
    }
    if (o->timeout_s > 0)
        put_seconds(&args, "--timeout", o->timeout_s);
    put_seconds(&args, "--grace", o->grace_s);
    if (o->max_restarts > 0) {
        snprintf(tmp, sizeof(tmp), " --max-restarts %d", o->max_restarts);
        put(&args, tmp, strlen(tmp));
    }
    if (o->log_dir) {
        put_quoted(&args, "--log-dir", o->log_dir);
        if (o->tee)
            put(&args, " --tee", 6);
    }
    if (!o->label)
        put(&args, " --no-label", 11);
    for (int i = 0; i < o->verbose && i < 8; i++)
        put(&args, " -v", 3);
    if (o->metrics_port_set || o->metrics_port != def.metrics_port) {
        snprintf(tmp, sizeof(tmp), " --metrics-port %d", o->metrics_port);
        put(&args, tmp, strlen(tmp));
    }
    if (o->metrics_bind_set || strcmp(o->metrics_bind, def.metrics_bind) != 0)
        put_quoted(&args, "--metrics-bind", o->metrics_bind);
    if (o->metrics_per_rank)
        put(&args, " --metrics-per-rank", 19);
    if (o->metrics_linger_s != def.metrics_linger_s)
        put_seconds(&args, "--metrics-linger", o->metrics_linger_s);
    if (o->metrics_stale_s > 0)
        put_seconds(&args, "--metrics-stale", o->metrics_stale_s);
    if (o->metrics_sd_file)
        put_quoted(&args, "--metrics-sd-file", o->metrics_sd_file);
    if (o->metrics_tls != def.metrics_tls)
        put_quoted(&args, "--metrics-tls", o->metrics_tls == TLS_ON ? "on" : "off");
    if (o->metrics_cert) {
        put_quoted(&args, "--metrics-cert", o->metrics_cert);
        put_quoted(&args, "--metrics-key", o->metrics_key);
    }
    for (int i = 0; i < o->prog_argc; i++) {
        char *q = shell_quote(o->prog_argv[i]);
        if (i)
            put(&program, " ", 1);
        put(&program, q ? q : "''", strlen(q ? q : "''"));
        free(q);
    }
    char *self_q = shell_quote(self);
    char *script = NULL;
    if (!args.bad && !program.bad && self_q) {
        const sbatch_var_t vars[] = {
            { "JOB_NAME", o->job_name ? o->job_name : name, false },
            { "NODES", nodes, false },
            /* GPUs: one task per GPU on every node. CPU ranks may outnumber a
             * node's CPUs, which --ntasks-per-node cannot ask for (sbatch:
             * "Requested node configuration is not available"): the task
             * count with --overcommit instead. */
            { "TASKS_PER_NODE", cuda ? tpn : "", false },
            { "NTASKS", cuda ? "" : ntasks, false },
            { "OVERCOMMIT", cuda ? "" : "--overcommit", false },
            { "GPUS_PER_NODE", cuda ? gpn : "", false },
            { "TIME", o->time ? o->time : CLI_DEFAULT_TIME, false },
            { "PARTITION", o->partition ? o->partition : "", false },
            { "ACCOUNT", o->account ? o->account : "", false },
            { "OUTPUT", o->output ? o->output : "bmt-%x-%j.out", false },
            { "SIGNAL_LEAD", lead, false },
            { "BMLAUNCH", self_q, true },
            { "BMLAUNCH_ARGS", args.s, true },
            { "PROGRAM", program.s, true },
        };
        script = sbatch_render(tmpl, vars, sizeof(vars) / sizeof(vars[0]), err);
        if (script == NULL)
            errprefix(err, "%.200s: ", path);
    } else {
        errprintf(err, "out of memory");
    }
    free(self_q);
    free(args.s);
    free(program.s);
    free(tmpl);
    return script;
}
