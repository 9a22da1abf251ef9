/* tests/progs/llama_ops_check.c — runs every op of nn/llama_ops_cpu.h on the
 * inputs that tests/tools/llama_ops_oracle.py generated, and writes the results
 * for the oracle to compare with torch (tests/integration/test_llama_ops.sh).
 *
 *   llama_ops_check [--perturb NAME FACTOR] INDIR OUTDIR
 *
 * INDIR/cases.txt lists the cases, one a line: "<case> <op> key=value..." (the
 * shapes and constants: eps, theta, the rope scaling). A case's inputs are
 * INDIR/<case>.<tensor>: raw little-endian float32, of the size the op's shapes
 * imply. OUTDIR (created if missing) gets OUTDIR/<case>.<tensor>, float32, for
 * every output and gradient, and OUTDIR/<case>.<grad>+= for the same backward run
 * into a buffer prefilled with prefill() (the oracle adds the same values), which
 * shows that backward functions accumulate. Forward outputs start as NaN, so an
 * element a forward leaves unwritten shows.
 *
 * --perturb NAME FACTOR multiplies the element of largest magnitude of output NAME
 * (e.g. attn_gqa2.dk, or attn_gqa2.dk+=) by FACTOR before it is written, so the
 * test can show that the comparison catches a wrong result. A NAME that matches
 * no output is an error.
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

#include "nn/llama_ops_cpu.h"

static const char *prog = "llama_ops_check";

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
    MAX_KEYS = 12,
    MAX_BUFS = 32
};

typedef struct tcase {
    char name[64], op[32];
    int nkeys;
    char key[MAX_KEYS][16];
    double val[MAX_KEYS];
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
        double v = strtod(eq + 1, &end);
        if (errno != 0 || end == eq + 1 || *end != '\0' || !isfinite(v)) {
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

/* An integer value of key in case c, at least min (sizes: 1; flags: 0). */
static int param(const tcase_t *c, const char *key, int min)
{
    double v = param_f(c, key);
    if (v != floor(v) || v < min || v > 100000000) {
        die("case %s: %s=%g, expected an integer >= %d", c->name, key, v, min);
    }
    return (int)v;
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

/* A forward output of n floats: NaN, so what is not written shows. */
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

/* INDIR/<case>.<tensor>, exactly n float32. */
static float *load_f32(const tcase_t *c, const char *tensor, size_t n)
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
    if (size < 0 || (size_t)size != n * sizeof(float)) {
        die("%s: %ld bytes, expected %zu (%zu float32)", path, size, n * sizeof(float), n);
    }
    rewind(f);
    float *p = alloc(n * sizeof *p);
    if (fread(p, sizeof *p, n, f) != n) {
        die("%s: short read", path);
    }
    fclose(f);
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

static void run_rmsnorm(const tcase_t *c)
{
    int N = param(c, "N", 1), C = param(c, "C", 1);
    float eps = (float)param_f(c, "eps");
    size_t NC = (size_t)N * C;
    const float *inp = load_f32(c, "inp", NC);      /* (N,C) */
    const float *weight = load_f32(c, "weight", C); /* (C) */
    const float *dout = load_f32(c, "dout", NC);    /* (N,C) */

    float *out = nans(NC), *rstd = nans(N); /* (N,C), (N) */
    nn_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    save(c, "out", 0, out, NC);
    save(c, "rstd", 0, rstd, N);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf(NC, acc), *dweight = grad_buf(C, acc);
        nn_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
        save(c, "dinp", acc, dinp, NC);
        save(c, "dweight", acc, dweight, C);
    }
}

/* scaled=1: Llama 3's scaling with factor, low, high, orig (the HF names
 * shortened); scaled=0: none (s NULL). */
static void run_rope_freqs(const tcase_t *c)
{
    int hd = param(c, "hd", 2);
    double theta = param_f(c, "theta");
    nn_rope_scaling_t s = { 0 };
    int scaled = param(c, "scaled", 0);
    if (scaled) {
        s.factor = param_f(c, "factor");
        s.low_freq_factor = param_f(c, "low");
        s.high_freq_factor = param_f(c, "high");
        s.original_max_position_embeddings = param(c, "orig", 1);
    }
    float *inv_freq = nans((size_t)hd / 2); /* (hd/2) */
    nn_rope_freqs(inv_freq, hd, theta, scaled ? &s : NULL);
    save(c, "inv_freq", 0, inv_freq, (size_t)hd / 2);
}

/* inv_freq is an input (the oracle's, rounded to f32): this case checks the
 * rotation alone; rope_freqs cases check nn_rope_freqs. */
static void run_rope(const tcase_t *c)
{
    int B = param(c, "B", 1), T = param(c, "T", 1), NH = param(c, "NH", 1);
    int hd = param(c, "hd", 2);
    size_t n = (size_t)B * T * NH * hd;
    const float *inp = load_f32(c, "inp", n);                        /* (B,T,NH,hd) */
    const float *inv_freq = load_f32(c, "inv_freq", (size_t)hd / 2); /* (hd/2) */
    const float *dout = load_f32(c, "dout", n);                      /* (B,T,NH,hd) */

    float *out = nans(n);
    nn_rope_forward(out, inp, inv_freq, B, T, NH, hd);
    save(c, "out", 0, out, n);
    float *x = alloc(n * sizeof *x); /* in place, as the model rotates q and k */
    memcpy(x, inp, n * sizeof *x);
    nn_rope_forward(x, x, inv_freq, B, T, NH, hd);
    save(c, "out_inplace", 0, x, n);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf(n, acc);
        nn_rope_backward(dinp, dout, inv_freq, B, T, NH, hd);
        save(c, "dinp", acc, dinp, n);
    }
}

static void run_swiglu(const tcase_t *c)
{
    int N = param(c, "N", 1);
    const float *gate = load_f32(c, "gate", N), *up = load_f32(c, "up", N); /* (N) */
    const float *dout = load_f32(c, "dout", N);                             /* (N) */
    float *out = nans(N);
    nn_swiglu_forward(out, gate, up, N);
    save(c, "out", 0, out, N);
    for (int acc = 0; acc <= 1; acc++) {
        float *dgate = grad_buf(N, acc), *dup = grad_buf(N, acc);
        nn_swiglu_backward(dgate, dup, dout, gate, up, N);
        save(c, "dgate", acc, dgate, N);
        save(c, "dup", acc, dup, N);
    }
}

static void run_attention(const tcase_t *c)
{
    int B = param(c, "B", 1), T = param(c, "T", 1), NH = param(c, "NH", 1);
    int NKV = param(c, "NKV", 1), hd = param(c, "hd", 1);
    if (NH % NKV != 0) {
        die("case %s: NH=%d is not a multiple of NKV=%d", c->name, NH, NKV);
    }
    size_t nq = (size_t)B * T * NH * hd, nkv = (size_t)B * T * NKV * hd;
    const float *q = load_f32(c, "q", nq);       /* (B,T,NH,hd) */
    const float *k = load_f32(c, "k", nkv);      /* (B,T,NKV,hd) */
    const float *v = load_f32(c, "v", nkv);      /* (B,T,NKV,hd) */
    const float *dout = load_f32(c, "dout", nq); /* (B,T,NH,hd) */

    float *out = nans(nq), *lse = nans((size_t)B * NH * T); /* (B,T,NH,hd), (B,NH,T) */
    nn_attention_forward(out, lse, q, k, v, B, T, NH, NKV, hd);
    save(c, "out", 0, out, nq);
    save(c, "lse", 0, lse, (size_t)B * NH * T);
    for (int acc = 0; acc <= 1; acc++) {
        float *dq = grad_buf(nq, acc), *dk = grad_buf(nkv, acc), *dv = grad_buf(nkv, acc);
        nn_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, hd);
        save(c, "dq", acc, dq, nq);
        save(c, "dk", acc, dk, nkv);
        save(c, "dv", acc, dv, nkv);
    }
}

/* Also a backward with dinp NULL ("dweight_nodinp"): the same dweight. */
static void run_matmul(const tcase_t *c)
{
    int N = param(c, "N", 1), IC = param(c, "IC", 1), OC = param(c, "OC", 1);
    size_t W = (size_t)IC * OC;
    const float *inp = load_f32(c, "inp", (size_t)N * IC);   /* (N,IC) */
    const float *weight = load_f32(c, "weight", W);          /* (OC,IC) */
    const float *dout = load_f32(c, "dout", (size_t)N * OC); /* (N,OC) */

    float *out = nans((size_t)N * OC); /* (N,OC) */
    nn_matmul_forward(out, inp, weight, N, IC, OC);
    save(c, "out", 0, out, (size_t)N * OC);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf((size_t)N * IC, acc); /* (N,IC) */
        float *dweight = grad_buf(W, acc);           /* (OC,IC) */
        nn_matmul_backward(dinp, dweight, dout, inp, weight, N, IC, OC);
        save(c, "dinp", acc, dinp, (size_t)N * IC);
        save(c, "dweight", acc, dweight, W);
        float *dweight2 = grad_buf(W, acc);
        nn_matmul_backward(NULL, dweight2, dout, inp, weight, N, IC, OC);
        save(c, "dweight_nodinp", acc, dweight2, W);
    }
}

static const struct {
    const char *op;
    void (*run)(const tcase_t *c);
} ops[] = {
    { "rmsnorm", run_rmsnorm }, { "rope_freqs", run_rope_freqs }, { "rope", run_rope },
    { "swiglu", run_swiglu },   { "attention", run_attention },   { "matmul", run_matmul },
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
