/* tests/progs/fp8_check.c — runs nn/fp8.h on the inputs tests/tools/fp8_oracle.py
 * wrote, and writes the results for the oracle to compare with its own
 * (tests/integration/test_fp8.sh).
 *
 *   fp8_check DIR
 *
 * Reads DIR/x.f32 (values to convert), DIR/qx.f32 and DIR/scales.f32 (a tensor
 * and the scales to quantize it with), DIR/mm.txt ("N K OC KA KB DESCALE", KA/KB
 * 0 = E4M3, 1 = E5M2) with DIR/mm_a.u8 (N,K) and DIR/mm_b.u8 (OC,K), and
 * DIR/amax.f32 (amax values to scale). Writes, for KIND e4m3 and e5m2:
 *   DIR/decode_KIND.f32   nn_fp8_to_f32 of the 256 codes
 *   DIR/encode_KIND.u8    nn_fp8_from_f32 of x
 *   DIR/quant_KIND_I.u8   nn_fp8_quantize of qx with scales[I]
 *   DIR/quant_KIND.txt    "I amax saturated" per scale
 *   DIR/rt_KIND.f32       nn_fp8_roundtrip of qx, and DIR/rt_KIND.txt its scale
 *   DIR/scale_KIND_M.f32  nn_fp8_scale of each amax with margin M (0, 3)
 *   DIR/mm.f32            nn_fp8_matmul
 * and for the emulated layer products, from DIR/lin.txt ("N IC OC"),
 * DIR/lin_{inp,w,b,dout}.f32, with WT 0 and 1 (the weight read as (IC,OC) or
 * (OC,IC)):
 *   DIR/lin_{out,dinp,dw,db}_WT.f32   nn_fp8_conv1d_forward/backward (gradients
 *                                     into zeros)
 *   DIR/lin_nan.txt       the return codes with a NaN in inp, then an inf in
 *                         dout, and whether out, dinp and dweight became all NaN
 * Exit status 0, 1 on a missing or short file (named), 2 on usage.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/fp8.h"

static const char *dir;

static void die(const char *what, const char *name)
{
    fprintf(stderr, "fp8_check: %s/%s: %s\n", dir, name, what);
    exit(1);
}

static void *load(const char *name, size_t elem, size_t *n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die(strerror(errno), name);
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (bytes <= 0 || bytes % (long)elem != 0)
        die("empty, or not a whole number of elements", name);
    void *p = malloc((size_t)bytes);
    if (p == NULL || fread(p, 1, (size_t)bytes, f) != (size_t)bytes)
        die("short read", name);
    fclose(f);
    *n = (size_t)bytes / elem;
    return p;
}

static void save(const char *name, const void *p, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0)
        die("cannot write", name);
}

/* The layer's four results as PREFIX_{out,dinp,dw,db}_TAG.f32. */
static void save_layer(const char *prefix, int tag, const float *out, size_t n_out,
                       const float *dinp, size_t n_in, const float *dw, size_t n_w, const float *db,
                       size_t n_b)
{
    const char *what[4] = { "out", "dinp", "dw", "db" };
    const float *v[4] = { out, dinp, dw, db };
    const size_t n[4] = { n_out, n_in, n_w, n_b };
    for (int k = 0; k < 4; k++) {
        char name[64];
        snprintf(name, sizeof(name), "%s_%s_%d.f32", prefix, what[k], tag);
        save(name, v[k], n[k] * 4);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fp8_check DIR\n");
        return 2;
    }
    dir = argv[1];
    size_t nx, nq, ns, na;
    const float *x = load("x.f32", 4, &nx);
    const float *qx = load("qx.f32", 4, &nq);
    const float *scales = load("scales.f32", 4, &ns);
    const float *amax = load("amax.f32", 4, &na);
    uint8_t *codes = malloc(nx > nq ? nx : nq);
    float *vals = malloc((na > nq ? na : nq) * sizeof(float));
    const char *kname[2] = { "e4m3", "e5m2" };
    for (int k = 0; k < 2; k++) {
        char name[64];
        float dec[256];
        for (int c = 0; c < 256; c++)
            dec[c] = nn_fp8_to_f32((uint8_t)c, (nn_fp8_kind_t)k);
        snprintf(name, sizeof(name), "decode_%s.f32", kname[k]);
        save(name, dec, sizeof(dec));
        for (size_t i = 0; i < nx; i++)
            codes[i] = nn_fp8_from_f32(x[i], (nn_fp8_kind_t)k);
        snprintf(name, sizeof(name), "encode_%s.u8", kname[k]);
        save(name, codes, nx);
        char txt[8192] = "";
        for (size_t s = 0; s < ns; s++) {
            size_t sat = 0;
            float m = nn_fp8_quantize(codes, qx, nq, scales[s], (nn_fp8_kind_t)k, &sat);
            snprintf(name, sizeof(name), "quant_%s_%zu.u8", kname[k], s);
            save(name, codes, nq);
            size_t len = strlen(txt);
            snprintf(txt + len, sizeof(txt) - len, "%zu %.9g %zu\n", s, m, sat);
        }
        snprintf(name, sizeof(name), "quant_%s.txt", kname[k]);
        save(name, txt, strlen(txt));
        memcpy(vals, qx, nq * sizeof(float));
        float rs = nn_fp8_roundtrip(vals, nq, (nn_fp8_kind_t)k);
        snprintf(name, sizeof(name), "rt_%s.f32", kname[k]);
        save(name, vals, nq * sizeof(float));
        snprintf(txt, sizeof(txt), "%.9g\n", rs);
        snprintf(name, sizeof(name), "rt_%s.txt", kname[k]);
        save(name, txt, strlen(txt));
        for (int margin = 0; margin <= 3; margin += 3) {
            for (size_t i = 0; i < na; i++)
                vals[i] = nn_fp8_scale(amax[i], (nn_fp8_kind_t)k, margin);
            snprintf(name, sizeof(name), "scale_%s_%d.f32", kname[k], margin);
            save(name, vals, na * sizeof(float));
        }
    }
    size_t nt;
    char *mm = load("mm.txt", 1, &nt);
    mm = realloc(mm, nt + 1);
    mm[nt] = '\0';
    int N, K, OC, ka, kb;
    float descale;
    if (sscanf(mm, "%d %d %d %d %d %f", &N, &K, &OC, &ka, &kb, &descale) != 6 || N < 1 || K < 1 ||
        OC < 1 || ka < 0 || ka > 1 || kb < 0 || kb > 1)
        die("not \"N K OC KA KB DESCALE\"", "mm.txt");
    size_t n1, n2;
    const uint8_t *a = load("mm_a.u8", 1, &n1);
    const uint8_t *b = load("mm_b.u8", 1, &n2);
    if (n1 != (size_t)N * K || n2 != (size_t)OC * K)
        die("sizes differ from mm.txt", "mm_a.u8 or mm_b.u8");
    float *out = malloc((size_t)N * OC * sizeof(float));
    nn_fp8_matmul(out, a, (nn_fp8_kind_t)ka, b, (nn_fp8_kind_t)kb, descale, N, K, OC);
    save("mm.f32", out, (size_t)N * OC * sizeof(float));
    size_t nl;
    char *lin = load("lin.txt", 1, &nl);
    lin = realloc(lin, nl + 1);
    lin[nl] = '\0';
    int LN, IC, LOC;
    if (sscanf(lin, "%d %d %d", &LN, &IC, &LOC) != 3 || LN < 1 || IC < 1 || LOC < 1)
        die("not \"N IC OC\"", "lin.txt");
    size_t n_in, n_w, n_b, n_d;
    float *inp = load("lin_inp.f32", 4, &n_in), *w = load("lin_w.f32", 4, &n_w);
    const float *bias = load("lin_b.f32", 4, &n_b), *dout = load("lin_dout.f32", 4, &n_d);
    if (n_in != (size_t)LN * IC || n_w != (size_t)IC * LOC || n_b != (size_t)LOC ||
        n_d != (size_t)LN * LOC)
        die("sizes differ from lin.txt", "lin_*.f32");
    float *lo = calloc(n_d, 4), *ldi = calloc(n_in, 4), *ldw = calloc(n_w, 4),
          *ldb = calloc(LOC, 4);
    for (int wt = 0; wt <= 1; wt++) {
        memset(ldi, 0, n_in * 4), memset(ldw, 0, n_w * 4), memset(ldb, 0, LOC * 4);
        if (nn_fp8_conv1d_forward(lo, inp, w, bias, LN, IC, LOC, wt) != 0 ||
            nn_fp8_conv1d_backward(ldi, ldw, ldb, dout, inp, w, LN, IC, LOC, wt) != 0)
            die("the emulated products failed", "lin_*.f32");
        save_layer("lin", wt, lo, n_d, ldi, n_in, ldw, n_w, ldb, LOC);
    }
    /* A NaN in inp, then an inf in dout: 1, and NaN everywhere. */
    inp[3] = NAN;
    int rf = nn_fp8_conv1d_forward(lo, inp, w, bias, LN, IC, LOC, 0);
    int rb = nn_fp8_conv1d_backward(ldi, ldw, ldb, dout, inp, w, LN, IC, LOC, 0);
    inp[3] = 0.5f;
    int poisoned = 1;
    for (size_t i = 0; i < n_d; i++)
        poisoned &= isnan(lo[i]);
    float *dn = malloc(n_d * 4);
    memcpy(dn, dout, n_d * 4);
    dn[5] = INFINITY;
    memset(ldi, 0, n_in * 4), memset(ldw, 0, n_w * 4);
    int rd = nn_fp8_conv1d_backward(ldi, ldw, ldb, dn, inp, w, LN, IC, LOC, 0);
    for (size_t i = 0; i < n_in; i++)
        poisoned &= isnan(ldi[i]);
    for (size_t i = 0; i < n_w; i++)
        poisoned &= isnan(ldw[i]);
    char txt[128];
    snprintf(txt, sizeof(txt), "%d %d %d %d\n", rf, rb, rd, poisoned);
    save("lin_nan.txt", txt, strlen(txt));
    /* Delayed scaling (nn_fp8_plan_t, history 3) over six passes of the same
     * layer, the input times DL_FACTOR[p], an infinity in it in pass 3:
     * pass 0 current, then each from the window; pass 4 grows past the
     * window's largest (saturates, as pass 1 does), pass 3's inf record takes no part. */
    static const float DL_FACTOR[6] = { 1.0f, 2.0f, 0.5f, 1.0f, 4.0f, 1.0f };
    nn_fp8_plan_t *plan = nn_fp8_plan_create(1, 3);
    float *xp = malloc(n_in * 4);
    if (plan == NULL || xp == NULL)
        die("out of memory", "plan");
    for (int pass = 0; pass < 6; pass++) {
        for (size_t i = 0; i < n_in; i++)
            xp[i] = inp[i] * DL_FACTOR[pass];
        if (pass == 3)
            xp[5] = INFINITY;
        memset(ldi, 0, n_in * 4), memset(ldw, 0, n_w * 4), memset(ldb, 0, LOC * 4);
        nn_fp8_plan_begin(plan);
        nn_fp8_scaling_t *sc = nn_fp8_plan_at(plan, 0);
        if (nn_fp8_linear_forward(sc, lo, xp, w, bias, LN, IC, LOC, 0) < 0 ||
            nn_fp8_linear_backward(sc, ldi, ldw, ldb, dout, xp, w, LN, IC, LOC, 0) < 0)
            die("the emulated products failed", "delayed");
        nn_fp8_plan_end(plan);
        save_layer("dl", pass, lo, n_d, ldi, n_in, ldw, n_w, ldb, LOC);
    }
    nn_fp8_plan_begin(plan); /* closes pass 5 */
    const nn_fp8_stats_t st = nn_fp8_plan_stats(plan);
    snprintf(txt, sizeof(txt), "%ld %ld %ld\n", st.passes, st.saturated, st.unscalable);
    save("dl_stats.txt", txt, strlen(txt));
    nn_fp8_plan_destroy(plan);
    free(xp);
    printf("fp8_check: %zu values, %zu x %zu quantized, %d x %d x %d product, %d x %d x %d layer "
           "written to %s\n",
           nx, ns, nq, N, K, OC, LN, IC, LOC, dir);
    free((void *)x), free((void *)qx), free((void *)scales), free((void *)amax), free(codes),
        free(vals), free(mm), free((void *)a), free((void *)b), free(out), free(lin), free(inp),
        free(w), free((void *)bias), free((void *)dout), free(lo), free(ldi), free(ldw), free(ldb),
        free(dn);
    return 0;
}
