/* tests/progs/llama_ops_check.c — runs every op of nn/llama_ops_cpu.h on the
 * inputs that tests/tools/llama_ops_oracle.py generated, and writes the results
 * for the oracle to compare with torch (tests/integration/test_llama_ops.sh).
 *
 *   llama_ops_check [--perturb NAME FACTOR] INDIR OUTDIR
 *
 * The files, --perturb (e.g. attn_gqa2.dk, or attn_gqa2.dk+=) and the exit
 * status are ops_harness.h's. Here the values of a case line are the shapes and
 * constants (eps, theta, the rope scaling), up to 12 of them; the inputs are all
 * float32.
 */
#include "nn/llama_ops_cpu.h"

#include "ops_harness.h"

/* A value of cases.txt: a finite number. */
static int parse_value(const char *s, double *v)
{
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return errno != 0 || end == s || *end != '\0' || !isfinite(*v) ? -1 : 0;
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

static const ops_op_t ops[] = {
    { "rmsnorm", run_rmsnorm }, { "rope_freqs", run_rope_freqs }, { "rope", run_rope },
    { "swiglu", run_swiglu },   { "attention", run_attention },   { "matmul", run_matmul },
};

int main(int argc, char **argv)
{
    static const ops_checker_t checker = {
        .prog = "llama_ops_check",
        .max_keys = 12,
        .parse_value = parse_value,
        .ops = ops,
        .nops = sizeof ops / sizeof ops[0],
    };
    return ops_main(argc, argv, &checker);
}
