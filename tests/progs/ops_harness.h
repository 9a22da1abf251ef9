/* tests/progs/ops_harness.h — what gpt2_ops_check.c and llama_ops_check.c share:
 * the case file, the buffers of a case, reading inputs and writing results, the
 * --perturb option and main's loop over the cases. A checker keeps only its ops
 * (one run function per op, in an ops_op_t table), how its case values parse,
 * and its own checks of them.
 *
 *   <checker> [--perturb NAME FACTOR] INDIR OUTDIR
 *
 * INDIR/cases.txt lists the cases, one a line: "<case> <op> key=value..." (the
 * shapes, and whatever constants the op takes). A case's inputs are
 * INDIR/<case>.<tensor>: raw little-endian float32 (or int32, load()), of the
 * size the op's shapes imply. OUTDIR (created if missing) gets
 * OUTDIR/<case>.<tensor>, float32, for every output and gradient, and
 * OUTDIR/<case>.<grad>+= for the same backward run into a buffer prefilled with
 * prefill() (the oracle adds the same values), which shows that backward
 * functions accumulate. Forward outputs start as NaN (nans()), so an element a
 * forward leaves unwritten shows.
 *
 * --perturb NAME FACTOR multiplies the element of largest magnitude of output NAME
 * (<case>.<tensor>, or <case>.<grad>+=) by FACTOR before it is written, so the
 * test can show that the comparison catches a wrong result. A NAME that matches
 * no output is an error.
 *
 * Exit status: 0; 1 on an error (a missing or short input, a bad case line, a
 * write error), with a message naming the file; 2 on a usage error.
 *
 * A header of static functions and state, for the one .c file of a checker
 * (every .c file of tests/progs is a program of its own): include it after the
 * ops' header, and make main return ops_main().
 */
#ifndef OPS_HARNESS_H
#define OPS_HARNESS_H

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum {
    OPS_MAX_KEYS = 12, /* key=value pairs of a case line, at most (ops_checker_t.max_keys) */
    OPS_MAX_BUFS = 32  /* buffers of one case */
};

typedef struct tcase {
    char name[64], op[32];
    int nkeys;
    char key[OPS_MAX_KEYS][16];
    double val[OPS_MAX_KEYS];
} tcase_t;

typedef struct ops_op {
    const char *op;                /* the op's name in cases.txt */
    void (*run)(const tcase_t *c); /* loads c's inputs, runs the op, saves its results */
} ops_op_t;

typedef struct ops_checker {
    const char *prog; /* first in every message */
    int max_keys;     /* key=value pairs a case line may have, 1 to OPS_MAX_KEYS */
    /* A value of a case line (the text after '=') into *v: 0, or -1 where it is
     * not one this checker takes (the line is then an error). */
    int (*parse_value)(const char *s, double *v);
    const ops_op_t *ops;
    size_t nops;
} ops_checker_t;

static const char *prog; /* the checker's, set by ops_main() */

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ------------------------------------------------------------ cases */

/* One line of cases.txt into c, at most max_keys pairs, each value through
 * parse_value; 0, or -1 for a bad line. */
static int parse_case(char *line, tcase_t *c, int max_keys,
                      int (*parse_value)(const char *s, double *v))
{
    memset(c, 0, sizeof *c);
    char *save = NULL;
    char *tok = strtok_r(line, " \t\n", &save);
    if (tok == NULL || strlen(tok) >= sizeof c->name) {
        return -1;
    }
    strcpy(c->name, tok);
    tok = strtok_r(NULL, " \t\n", &save);
    if (tok == NULL || strlen(tok) >= sizeof c->op) {
        return -1;
    }
    strcpy(c->op, tok);
    while ((tok = strtok_r(NULL, " \t\n", &save)) != NULL) {
        char *eq = strchr(tok, '=');
        if (eq == NULL || eq == tok || (size_t)(eq - tok) >= sizeof c->key[0] ||
            c->nkeys == max_keys) {
            return -1;
        }
        double v;
        if (parse_value(eq + 1, &v) != 0) {
            return -1;
        }
        memcpy(c->key[c->nkeys], tok, (size_t)(eq - tok));
        c->val[c->nkeys++] = v;
    }
    return 0;
}

/* The value of key in case c, which must be there. */
static double param_f(const tcase_t *c, const char *key)
{
    for (int i = 0; i < c->nkeys; i++) {
        if (strcmp(c->key[i], key) == 0) {
            return c->val[i];
        }
    }
    die("case %s (op %s): no %s= in cases.txt", c->name, c->op, key);
}

/* ------------------------------------------------------------ buffers and files */

static const char *indir, *outdir;
static const char *perturb_name; /* --perturb NAME FACTOR */
static double perturb_factor;
static int perturbed;

/* Every buffer of the case being run, freed when it ends. */
static void *bufs[OPS_MAX_BUFS];
static int nbufs;

static void *alloc(size_t bytes)
{
    if (nbufs == OPS_MAX_BUFS) {
        die("more than %d buffers in one case", OPS_MAX_BUFS);
    }
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        die("out of memory (%zu bytes)", bytes);
    }
    bufs[nbufs++] = p;
    return p;
}

static void free_all(void)
{
    while (nbufs > 0) {
        free(bufs[--nbufs]);
    }
}

/* A forward output or scratch buffer of n floats: NaN, so what is not written shows. */
static float *nans(size_t n)
{
    float *x = alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        x[i] = NAN;
    }
    return x;
}

/* A gradient buffer of n floats: zero, or (accumulate) prefilled with
 * 0.5 + 0.125 (i mod 7), exact in float32 and known to the oracle (prefill()). */
static float *grad_buf(size_t n, int accumulate)
{
    float *x = alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        x[i] = accumulate ? 0.5f + 0.125f * (float)(i % 7) : 0.0f;
    }
    return x;
}

/* INDIR/<case>.<tensor>, exactly n elements of elsize bytes (type names them in
 * the message of a file of the wrong size). */
static void *load(const tcase_t *c, const char *tensor, size_t n, size_t elsize, const char *type)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", indir, c->name, tensor);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        die("%s: %s (input %s of case %s)", path, strerror(errno), tensor, c->name);
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        die("%s: %s", path, strerror(errno));
    }
    long size = ftell(f);
    if (size < 0 || (size_t)size != n * elsize) {
        die("%s: %ld bytes, expected %zu (%zu %s)", path, size, n * elsize, n, type);
    }
    rewind(f);
    void *p = alloc(n * elsize);
    if (fread(p, elsize, n, f) != n) {
        die("%s: short read", path);
    }
    fclose(f);
    return p;
}

static float *load_f32(const tcase_t *c, const char *tensor, size_t n)
{
    return load(c, tensor, n, sizeof(float), "float32");
}

/* OUTDIR/<case>.<tensor>[+=], n floats (after the perturbation, if it names it). */
static void save(const tcase_t *c, const char *tensor, int accumulate, float *x, size_t n)
{
    char label[128], path[4096];
    snprintf(label, sizeof label, "%s.%s%s", c->name, tensor, accumulate ? "+=" : "");
    if (perturb_name != NULL && strcmp(label, perturb_name) == 0 && n > 0) {
        size_t imax = 0;
        for (size_t i = 1; i < n; i++) {
            if (fabsf(x[i]) > fabsf(x[imax])) {
                imax = i;
            }
        }
        printf("%s: perturbed %s[%zu]: %.9g -> %.9g\n", prog, label, imax, x[imax],
               x[imax] * perturb_factor);
        x[imax] = (float)(x[imax] * perturb_factor);
        perturbed = 1;
    }
    snprintf(path, sizeof path, "%s/%s", outdir, label);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        die("%s: %s", path, strerror(errno));
    }
    if (fwrite(x, sizeof *x, n, f) != n || fclose(f) != 0) {
        die("%s: write error: %s", path, strerror(errno));
    }
}

/* ------------------------------------------------------------ main */

static void usage(void)
{
    fprintf(stderr, "usage: %s [--perturb NAME FACTOR] INDIR OUTDIR\n", prog);
    exit(2);
}

/* The checker's main: parses the command line, runs every case of cases.txt
 * through checker's ops, and returns 0 (or exits 1 or 2, above). */
static int ops_main(int argc, char **argv, const ops_checker_t *checker)
{
    prog = checker->prog;
    if (checker->max_keys < 1 || checker->max_keys > OPS_MAX_KEYS) {
        die("max_keys %d is not in [1, %d]", checker->max_keys, OPS_MAX_KEYS);
    }
    int i = 1;
    if (i < argc && strcmp(argv[i], "--perturb") == 0) {
        if (i + 2 >= argc) {
            usage();
        }
        char *end;
        perturb_name = argv[i + 1];
        perturb_factor = strtod(argv[i + 2], &end);
        if (end == argv[i + 2] || *end != '\0') {
            usage();
        }
        i += 3;
    }
    if (argc - i != 2 || argv[i][0] == '-') {
        usage();
    }
    indir = argv[i];
    outdir = argv[i + 1];
    const uint32_t one = 1;
    if (*(const unsigned char *)&one != 1) {
        die("the input files are little-endian and this machine is not");
    }
    if (mkdir(outdir, 0777) != 0 && errno != EEXIST) {
        die("%s: %s", outdir, strerror(errno));
    }

    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/cases.txt", indir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        die("%s: %s", path, strerror(errno));
    }
    int ncases = 0;
    for (int lineno = 1; fgets(line, sizeof line, f) != NULL; lineno++) {
        char copy[sizeof line];
        strcpy(copy, line);
        tcase_t c;
        if (parse_case(line, &c, checker->max_keys, checker->parse_value) != 0) {
            die("%s:%d: not \"<case> <op> key=value...\": %s", path, lineno, copy);
        }
        size_t k = 0;
        while (k < checker->nops && strcmp(checker->ops[k].op, c.op) != 0) {
            k++;
        }
        if (k == checker->nops) {
            die("%s:%d: unknown op %s", path, lineno, c.op);
        }
        checker->ops[k].run(&c);
        free_all();
        printf("%s: %s (%s)\n", prog, c.name, c.op);
        ncases++;
    }
    fclose(f);
    if (ncases == 0) {
        die("%s: no cases", path);
    }
    if (perturb_name != NULL && !perturbed) {
        die("--perturb %s: no output has that name", perturb_name);
    }
    printf("%s: %d cases written to %s\n", prog, ncases, outdir);
    return 0;
}

#endif
