/* tests/progs/gpt2_ops_check.c — runs every op of examples/gpt2/ops_cpu.h on the
 * inputs that tests/tools/gpt2_ops_oracle.py generated, and writes the results
 * for the oracle to compare with torch (tests/integration/test_gpt2_ops.sh).
 *
 *   gpt2_ops_check [--perturb NAME FACTOR] INDIR OUTDIR
 *
 * INDIR/cases.txt lists the cases, one a line: "<case> <op> key=value..." (the
 * shapes). A case's inputs are INDIR/<case>.<tensor>: raw little-endian float32,
 * or int32 for token ids and targets, of the size the op's shapes imply.
 * OUTDIR (created if missing) gets OUTDIR/<case>.<tensor>, float32, for every
 * output and gradient, and OUTDIR/<case>.<grad>+= for the same backward run into
 * a buffer prefilled with prefill() (the oracle adds the same values), which
 * shows that backward functions accumulate. Forward outputs start as NaN, so an
 * element a forward leaves unwritten shows; attention's scratch starts as NaN too.
 *
 * --perturb NAME FACTOR multiplies the element of largest magnitude of output NAME
 * (e.g. attention.dqkv, or attention.dqkv+=) by FACTOR before it is written, so
 * the test can show that the comparison catches a wrong result. A NAME that
 * matches no output is an error.
 *
 * Exit status: 0; 1 on an error (a missing or short input, a bad case line, a
 * write error), with a message naming the file; 2 on a usage error.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpt2/ops_cpu.h"

static const char *prog = "gpt2_ops_check";

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

enum {
    MAX_KEYS = 8,
    MAX_BUFS = 32
};

typedef struct tcase {
    char name[64], op[32];
    int nkeys;
    char key[MAX_KEYS][16];
    long val[MAX_KEYS];
} tcase_t;

/* One line of cases.txt into c; 0, or -1 for a bad line. */
static int parse_case(char *line, tcase_t *c)
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
            c->nkeys == MAX_KEYS) {
            return -1;
        }
        char *end;
        errno = 0;
        long v = strtol(eq + 1, &end, 10);
        if (errno != 0 || end == eq + 1 || *end != '\0' || v < 0 || v > 100000000) {
            return -1;
        }
        memcpy(c->key[c->nkeys], tok, (size_t)(eq - tok));
        c->val[c->nkeys++] = v;
    }
    return 0;
}

/* The value of key in case c, which must be there and positive (flags: >= 0). */
static int param(const tcase_t *c, const char *key, int min)
{
    for (int i = 0; i < c->nkeys; i++) {
        if (strcmp(c->key[i], key) == 0) {
            if (c->val[i] < min) {
                die("case %s: %s=%ld, expected >= %d", c->name, key, c->val[i], min);
            }
            return (int)c->val[i];
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
static void *bufs[MAX_BUFS];
static int nbufs;

static void *alloc(size_t bytes)
{
    if (nbufs == MAX_BUFS) {
        die("more than %d buffers in one case", MAX_BUFS);
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

/* INDIR/<case>.<tensor>, exactly n elements of elsize bytes. */
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

/* int32 ids, each checked to lie in [lo, hi). */
static int32_t *load_ids(const tcase_t *c, const char *tensor, size_t n, int lo, int hi)
{
    int32_t *p = load(c, tensor, n, sizeof(int32_t), "int32");
    for (size_t i = 0; i < n; i++) {
        if (p[i] < lo || p[i] >= hi) {
            die("%s/%s.%s: element %zu is %d, outside [%d, %d)", indir, c->name, tensor, i,
                (int)p[i], lo, hi);
        }
    }
    return p;
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

/* ------------------------------------------------------------ the ops */

static void run_encoder(const tcase_t *c)
{
    int B = param(c, "B", 1), T = param(c, "T", 1), C = param(c, "C", 1);
    int V = param(c, "V", 1), maxT = param(c, "maxT", T);
    size_t BT = (size_t)B * T;
    const int32_t *inp = load_ids(c, "inp", BT, 0, V);       /* (B,T) */
    const float *wte = load_f32(c, "wte", (size_t)V * C);    /* (V,C) */
    const float *wpe = load_f32(c, "wpe", (size_t)maxT * C); /* (maxT,C) */
    const float *dout = load_f32(c, "dout", BT * C);         /* (B,T,C) */

    float *out = nans(BT * C); /* (B,T,C) */
    gpt2_encoder_forward(out, inp, wte, wpe, B, T, C);
    save(c, "out", 0, out, BT * C);
    for (int acc = 0; acc <= 1; acc++) {
        float *dwte = grad_buf((size_t)V * C, acc);    /* (V,C) */
        float *dwpe = grad_buf((size_t)maxT * C, acc); /* (maxT,C) */
        gpt2_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
        save(c, "dwte", acc, dwte, (size_t)V * C);
        save(c, "dwpe", acc, dwpe, (size_t)maxT * C);
    }
}

static void run_layernorm(const tcase_t *c)
{
    int N = param(c, "N", 1), C = param(c, "C", 1);
    size_t NC = (size_t)N * C;
    const float *inp = load_f32(c, "inp", NC);      /* (N,C) */
    const float *weight = load_f32(c, "weight", C); /* (C) */
    const float *bias = load_f32(c, "bias", C);     /* (C) */
    const float *dout = load_f32(c, "dout", NC);    /* (N,C) */

    float *out = nans(NC), *mean = nans(N), *rstd = nans(N); /* (N,C), (N), (N) */
    gpt2_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    save(c, "out", 0, out, NC);
    save(c, "mean", 0, mean, N);
    save(c, "rstd", 0, rstd, N);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf(NC, acc), *dweight = grad_buf(C, acc), *dbias = grad_buf(C, acc);
        gpt2_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
        save(c, "dinp", acc, dinp, NC);
        save(c, "dweight", acc, dweight, C);
        save(c, "dbias", acc, dbias, C);
    }
}

/* With bias=0 the case is the LM head's: no bias, dbias NULL, and also a backward
 * with dinp NULL ("dweight_nodinp"). */
static void run_matmul(const tcase_t *c)
{
    int N = param(c, "N", 1), IC = param(c, "IC", 1), OC = param(c, "OC", 1);
    int wt = param(c, "wt", 0), has_bias = param(c, "bias", 0);
    size_t W = (size_t)IC * OC;
    const float *inp = load_f32(c, "inp", (size_t)N * IC);                 /* (N,IC) */
    const float *weight = load_f32(c, "weight", W);                        /* (IC,OC) or (OC,IC) */
    const float *bias = has_bias ? load_f32(c, "bias", (size_t)OC) : NULL; /* (OC) */
    const float *dout = load_f32(c, "dout", (size_t)N * OC);               /* (N,OC) */

    float *out = nans((size_t)N * OC); /* (N,OC) */
    gpt2_matmul_forward(out, inp, weight, bias, N, IC, OC, wt);
    save(c, "out", 0, out, (size_t)N * OC);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf((size_t)N * IC, acc);                /* (N,IC) */
        float *dweight = grad_buf(W, acc);                          /* as weight */
        float *dbias = has_bias ? grad_buf((size_t)OC, acc) : NULL; /* (OC) */
        gpt2_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, wt);
        save(c, "dinp", acc, dinp, (size_t)N * IC);
        save(c, "dweight", acc, dweight, W);
        if (has_bias) {
            save(c, "dbias", acc, dbias, (size_t)OC);
        } else {
            float *dweight2 = grad_buf(W, acc);
            gpt2_matmul_backward(NULL, dweight2, NULL, dout, inp, weight, N, IC, OC, wt);
            save(c, "dweight_nodinp", acc, dweight2, W);
        }
    }
}

static void run_attention(const tcase_t *c)
{
    int B = param(c, "B", 1), T = param(c, "T", 1), C = param(c, "C", 1);
    int NH = param(c, "NH", 1);
    if (C % NH != 0) {
        die("case %s: C=%d is not a multiple of NH=%d", c->name, C, NH);
    }
    size_t BT = (size_t)B * T, ATT = (size_t)B * NH * T * T;
    const float *qkv = load_f32(c, "qkv", BT * 3 * C); /* (B,T,3C) */
    const float *dout = load_f32(c, "dout", BT * C);   /* (B,T,C) */

    float *out = nans(BT * C);                   /* (B,T,C) */
    float *preatt = nans(ATT), *att = nans(ATT); /* (B,NH,T,T) */
    gpt2_attention_forward(out, preatt, att, qkv, B, T, C, NH);
    save(c, "out", 0, out, BT * C);
    save(c, "preatt", 0, preatt, ATT);
    save(c, "att", 0, att, ATT);
    for (int acc = 0; acc <= 1; acc++) {
        float *dqkv = grad_buf(BT * 3 * C, acc);       /* (B,T,3C) */
        float *dpreatt = nans(ATT), *datt = nans(ATT); /* (B,NH,T,T) scratch */
        gpt2_attention_backward(dqkv, dpreatt, datt, dout, qkv, att, B, T, C, NH);
        save(c, "dqkv", acc, dqkv, BT * 3 * C);
        if (acc == 0) { /* scratch: overwritten, never accumulated */
            save(c, "dpreatt", 0, dpreatt, ATT);
            save(c, "datt", 0, datt, ATT);
        }
    }
}

static void run_gelu(const tcase_t *c)
{
    int N = param(c, "N", 1);
    const float *inp = load_f32(c, "inp", N);   /* (N) */
    const float *dout = load_f32(c, "dout", N); /* (N) */
    float *out = nans(N);                       /* (N) */
    gpt2_gelu_forward(out, inp, N);
    save(c, "out", 0, out, N);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf(N, acc); /* (N) */
        gpt2_gelu_backward(dinp, inp, dout, N);
        save(c, "dinp", acc, dinp, N);
    }
}

static void run_residual(const tcase_t *c)
{
    int N = param(c, "N", 1);
    const float *a = load_f32(c, "a", N), *b = load_f32(c, "b", N); /* (N) */
    float *out = nans(N);                                           /* (N) */
    gpt2_residual_forward(out, a, b, N);
    save(c, "out", 0, out, N);
    /* in place, as the model adds a block's output to the residual stream */
    float *x = alloc((size_t)N * sizeof *x), *y = alloc((size_t)N * sizeof *y);
    memcpy(x, a, (size_t)N * sizeof *x);
    memcpy(y, b, (size_t)N * sizeof *y);
    gpt2_residual_forward(x, x, b, N);
    gpt2_residual_forward(y, a, y, N);
    save(c, "out_in_a", 0, x, N);
    save(c, "out_in_b", 0, y, N);
}

static void run_crossentropy(const tcase_t *c)
{
    int B = param(c, "B", 1), T = param(c, "T", 1), V = param(c, "V", 1);
    size_t BT = (size_t)B * T;
    const float *logits = load_f32(c, "logits", BT * V);        /* (B,T,V) */
    const int32_t *targets = load_ids(c, "targets", BT, -1, V); /* (B,T), -1: ignored */
    const float *dloss = load_f32(c, "dloss", 1);               /* (1) */

    float *losses = nans(BT), *probs = nans(BT * V); /* (B,T), (B,T,V) */
    gpt2_crossentropy_forward(losses, probs, logits, targets, B, T, V);
    save(c, "losses", 0, losses, BT);
    save(c, "probs", 0, probs, BT * V);
    for (int acc = 0; acc <= 1; acc++) {
        float *dlogits = grad_buf(BT * V, acc); /* (B,T,V) */
        gpt2_crossentropy_backward(dlogits, probs, targets, dloss[0], B, T, V);
        save(c, "dlogits", acc, dlogits, BT * V);
    }
}

static const struct {
    const char *op;
    void (*run)(const tcase_t *c);
} ops[] = {
    { "encoder", run_encoder },
    { "layernorm", run_layernorm },
    { "matmul", run_matmul },
    { "attention", run_attention },
    { "gelu", run_gelu },
    { "residual", run_residual },
    { "crossentropy", run_crossentropy },
};

/* ------------------------------------------------------------ main */

static void usage(void)
{
    fprintf(stderr, "usage: %s [--perturb NAME FACTOR] INDIR OUTDIR\n", prog);
    exit(2);
}

int main(int argc, char **argv)
{
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
        if (parse_case(line, &c) != 0) {
            die("%s:%d: not \"<case> <op> key=value...\": %s", path, lineno, copy);
        }
        size_t k = 0;
        while (k < sizeof ops / sizeof ops[0] && strcmp(ops[k].op, c.op) != 0) {
            k++;
        }
        if (k == sizeof ops / sizeof ops[0]) {
            die("%s:%d: unknown op %s", path, lineno, c.op);
        }
        ops[k].run(&c);
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
