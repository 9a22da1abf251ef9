/* tests/progs/gpt2_ops_check.c — runs every op of nn/ops_cpu.h on the
 * inputs that tests/tools/gpt2_ops_oracle.py generated, and writes the results
 * for the oracle to compare with torch (tests/integration/test_gpt2_ops.sh).
 *
 *   gpt2_ops_check [--perturb NAME FACTOR] INDIR OUTDIR
 *
 * The files, --perturb (e.g. attention.dqkv, or attention.dqkv+=) and the exit
 * status are ops_harness.h's. Here the values of a case line are the shapes,
 * integers; the inputs are float32, or int32 for token ids and targets (checked
 * against the vocabulary). Attention's scratch starts as NaN too, as the forward
 * outputs do.
 */
#include "nn/ops_cpu.h"

#include "ops_harness.h"

/* A value of cases.txt: an integer in [0, 1e8]. */
static int parse_value(const char *s, double *v)
{
    char *end;
    errno = 0;
    long l = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || l < 0 || l > 100000000) {
        return -1;
    }
    *v = (double)l;
    return 0;
}

/* The value of key in case c, which must be there and positive (flags: >= 0). */
static int param(const tcase_t *c, const char *key, int min)
{
    long v = (long)param_f(c, key);
    if (v < min) {
        die("case %s: %s=%ld, expected >= %d", c->name, key, v, min);
    }
    return (int)v;
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
    nn_encoder_forward(out, inp, wte, wpe, B, T, C);
    save(c, "out", 0, out, BT * C);
    for (int acc = 0; acc <= 1; acc++) {
        float *dwte = grad_buf((size_t)V * C, acc);    /* (V,C) */
        float *dwpe = grad_buf((size_t)maxT * C, acc); /* (maxT,C) */
        nn_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
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
    nn_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    save(c, "out", 0, out, NC);
    save(c, "mean", 0, mean, N);
    save(c, "rstd", 0, rstd, N);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf(NC, acc), *dweight = grad_buf(C, acc), *dbias = grad_buf(C, acc);
        nn_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
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
    nn_conv1d_forward(out, inp, weight, bias, N, IC, OC, wt);
    save(c, "out", 0, out, (size_t)N * OC);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf((size_t)N * IC, acc);                /* (N,IC) */
        float *dweight = grad_buf(W, acc);                          /* as weight */
        float *dbias = has_bias ? grad_buf((size_t)OC, acc) : NULL; /* (OC) */
        nn_conv1d_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, wt);
        save(c, "dinp", acc, dinp, (size_t)N * IC);
        save(c, "dweight", acc, dweight, W);
        if (has_bias) {
            save(c, "dbias", acc, dbias, (size_t)OC);
        } else {
            float *dweight2 = grad_buf(W, acc);
            nn_conv1d_backward(NULL, dweight2, NULL, dout, inp, weight, N, IC, OC, wt);
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
    nn_attention_qkv_forward(out, preatt, att, qkv, B, T, C, NH);
    save(c, "out", 0, out, BT * C);
    save(c, "preatt", 0, preatt, ATT);
    save(c, "att", 0, att, ATT);
    for (int acc = 0; acc <= 1; acc++) {
        float *dqkv = grad_buf(BT * 3 * C, acc);       /* (B,T,3C) */
        float *dpreatt = nans(ATT), *datt = nans(ATT); /* (B,NH,T,T) scratch */
        nn_attention_qkv_backward(dqkv, dpreatt, datt, dout, qkv, att, B, T, C, NH);
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
    nn_gelu_forward(out, inp, N);
    save(c, "out", 0, out, N);
    for (int acc = 0; acc <= 1; acc++) {
        float *dinp = grad_buf(N, acc); /* (N) */
        nn_gelu_backward(dinp, inp, dout, N);
        save(c, "dinp", acc, dinp, N);
    }
}

static void run_residual(const tcase_t *c)
{
    int N = param(c, "N", 1);
    const float *a = load_f32(c, "a", N), *b = load_f32(c, "b", N); /* (N) */
    float *out = nans(N);                                           /* (N) */
    nn_residual_forward(out, a, b, N);
    save(c, "out", 0, out, N);
    /* in place, as the model adds a block's output to the residual stream */
    float *x = alloc((size_t)N * sizeof *x), *y = alloc((size_t)N * sizeof *y);
    memcpy(x, a, (size_t)N * sizeof *x);
    memcpy(y, b, (size_t)N * sizeof *y);
    nn_residual_forward(x, x, b, N);
    nn_residual_forward(y, a, y, N);
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
    nn_crossentropy_forward(losses, probs, logits, targets, B, T, V);
    save(c, "losses", 0, losses, BT);
    save(c, "probs", 0, probs, BT * V);
    for (int acc = 0; acc <= 1; acc++) {
        float *dlogits = grad_buf(BT * V, acc); /* (B,T,V) */
        nn_crossentropy_backward(dlogits, probs, targets, dloss[0], B, T, V);
        save(c, "dlogits", acc, dlogits, BT * V);
    }
}

static const ops_op_t ops[] = {
    { "encoder", run_encoder },
    { "layernorm", run_layernorm },
    { "matmul", run_matmul },
    { "attention", run_attention },
    { "gelu", run_gelu },
    { "residual", run_residual },
    { "crossentropy", run_crossentropy },
};

int main(int argc, char **argv)
{
    static const ops_checker_t checker = {
        .prog = "gpt2_ops_check",
        .max_keys = 8,
        .parse_value = parse_value,
        .ops = ops,
        .nops = sizeof ops / sizeof ops[0],
    };
    return ops_main(argc, argv, &checker);
}
