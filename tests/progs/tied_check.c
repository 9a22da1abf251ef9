/* tests/progs/tied_check.c — a tied block (bmt_blocklist_append_tied) against an
 * fp64 reference, under any layout.
 *
 *     bmlaunch -g G -n P -- tied_check [--zero 2|3] [--ckpt 0|1] [--prefetch 0|1] [--accum A]
 *                                      [--overwrite 0|1]
 *
 * The model is GPT-2's tying in miniature: block "emb" holds wte (V x D); its
 * first use embeds tokens (h0 = wte[x]), block "mid" is h1 = tanh(h0 W + b),
 * and emb's tied second use is the LM head (logits = h1 wte^T) with a mean
 * cross-entropy loss. wte's gradient is the sum of both uses' contributions,
 * reduce-scattered at each use into one shard and crossed over the groups once.
 *
 * How the gradient is observed: one AdamW step with lr = eps = 1e6 and no weight
 * decay moves every parameter by -lr g / (|g| + eps) = -g / (1 + |g| / 1e6),
 * i.e. by -g to a relative 1e-6. The program gathers the parameters after the
 * step and compares p0 - p1 with the reference gradient of the whole model,
 * averaged over every global micro-batch of the step (world x accum), computed
 * in double by plain loops that never call libbmt. It also checks the grad norm
 * the step reports, that leaving out either use's contribution would be caught
 * (the two contributions are each far above the bound), that the gathered
 * buffers peak at what the schedule holds, each the size of its block (emb and
 * mid under zero 3 with prefetch, emb without; one per block under zero 2),
 * that the full gradient buffers of a group of more than one peak at emb +
 * mid (sized per block) and are gone after the backward, and that two more
 * steps run. Every backward call's grads_fresh is checked: in a group of one
 * the head's use and mid are fresh at a step's first micro-batch only, the
 * embedding's use never (the head's contribution is in the shard already);
 * in larger groups every call is. With --overwrite 1 the list leaves fresh
 * gradients to the callbacks (bmt_blocklist_set_grad_overwrite), which then
 * zero them first; run it under BMT_CHECK_OVERWRITE=1, where they arrive as
 * NaN, so a wrong grads_fresh loses a use's contribution or makes NaN.
 * Data: rank r's a-th micro-batch of step s is global micro-batch a x world + r;
 * its tokens and targets are hashes of (s, global index, row).
 * Output: "ok ..." lines on rank 0, "FAIL ..." on any rank; exit 1 on failure.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/device.h"
#include "bmt/optim.h"

enum {
    V = 37,
    D = 20,
    B = 5
};
#define SEED 4242u

static const bmt_init_t WTE_INIT = { BMT_INIT_NORMAL, 0, 0.5, 1 };
static const bmt_init_t W_INIT = { BMT_INIT_NORMAL, 0, 0.3, 1 };
static const bmt_init_t B_INIT = { BMT_INIT_UNIFORM, -0.1, 0.1, 1 };

static int failures;
static int my_rank;

static void check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!cond || my_rank == 0) {
        printf("%s (rank %d) ", cond ? "ok" : "FAIL", my_rank);
        vprintf(fmt, ap);
        printf("\n");
    }
    va_end(ap);
    if (!cond)
        failures++;
    fflush(stdout);
}

static uint32_t hash3(uint32_t a, uint32_t b, uint32_t c)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ a;
    h = (h ^ b) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 31) ^ c) * 0x94d049bb133111ebULL;
    return (uint32_t)(h ^ (h >> 29));
}

static void batch(int step, int global, int32_t *x, int32_t *t)
{
    for (int i = 0; i < B; i++) {
        x[i] = (int32_t)(hash3((uint32_t)step, (uint32_t)global, (uint32_t)i) % V);
        t[i] = (int32_t)(hash3((uint32_t)step + 1000u, (uint32_t)global, (uint32_t)i) % V);
    }
}

/* ------------------------------------------------------------ the model (f32, host) */

typedef struct model {
    bmt_ctx_t *ctx;
    int step, world, rank;
    int32_t x[B], t[B];
    float h0[B * D], h1[B * D], probs[B * V]; /* activations of the current micro-batch */
    float dh1[B * D], dh0[B * D];             /* gradients passed down */
    float loss;
    bool overwrite; /* --overwrite 1: fresh gradients are this model's to write */
    int bad_fresh;  /* backward calls whose grads_fresh was not what the header says */
    int gpg;        /* the layout's gpus per group */
} model_t;

/* Count a backward call whose grads_fresh is wrong (use 0 the embedding, 1
 * mid, 2 the head). */
static void check_fresh(model_t *m, const bmt_block_call_t *c)
{
    m->bad_fresh += c->grads_fresh != (m->gpg > 1 || (c->index != 0 && c->microbatch == 0));
}

/* With --overwrite, a fresh gradient (n floats at g) is zeroed before the
 * callback adds into it: the callback writes every element. */
static void zero_fresh(const model_t *m, const bmt_block_call_t *c, float *g, int n)
{
    if (m->overwrite && c->grads_fresh)
        memset(g, 0, (size_t)n * sizeof(float));
}

/* Parameters arrive on the device; this test runs on cpu, where device memory is
 * host memory, and refuses cuda in main. */
static int emb_forward(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    model_t *m = mp;
    const float *wte = c->params[0]; /* (V, D) full */
    if (c->index == 0) {             /* the embedding */
        batch(m->step, c->microbatch * m->world + m->rank, m->x, m->t);
        for (int i = 0; i < B; i++)
            memcpy(&m->h0[i * D], &wte[m->x[i] * D], D * sizeof(float));
        return 0;
    }
    /* the tied LM head: logits = h1 wte^T, softmax, mean cross-entropy */
    double total = 0;
    for (int i = 0; i < B; i++) {
        float *p = &m->probs[i * V], mx = -INFINITY;
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int k = 0; k < D; k++)
                s += (double)m->h1[i * D + k] * wte[v * D + k];
            p[v] = (float)s;
            mx = p[v] > mx ? p[v] : mx;
        }
        double z = 0;
        for (int v = 0; v < V; v++)
            z += exp((double)p[v] - mx);
        for (int v = 0; v < V; v++)
            p[v] = (float)(exp((double)p[v] - mx) / z);
        total -= log(p[m->t[i]]);
    }
    m->loss = (float)(total / B);
    return 0;
}

static int emb_backward(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    model_t *m = mp;
    const float *wte = c->params[0];
    float *dwte = c->grads[0]; /* (V, D) full, f32: add into it */
    check_fresh(m, c);
    zero_fresh(m, c, dwte, V * D);
    if (c->index == 0) {
        for (int i = 0; i < B; i++)
            for (int k = 0; k < D; k++)
                dwte[m->x[i] * D + k] += m->dh0[i * D + k];
        return 0;
    }
    for (int i = 0; i < B; i++)
        for (int k = 0; k < D; k++)
            m->dh1[i * D + k] = 0;
    for (int i = 0; i < B; i++)
        for (int v = 0; v < V; v++) {
            float dl = (m->probs[i * V + v] - (v == m->t[i] ? 1.0f : 0.0f)) / B;
            for (int k = 0; k < D; k++) {
                dwte[v * D + k] += dl * m->h1[i * D + k];
                m->dh1[i * D + k] += dl * wte[v * D + k];
            }
        }
    return 0;
}

static int mid_forward(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    model_t *m = mp;
    const float *W = c->params[0], *b = c->params[1]; /* (D, D) in x out, (D) */
    for (int i = 0; i < B; i++)
        for (int o = 0; o < D; o++) {
            double s = b[o];
            for (int k = 0; k < D; k++)
                s += (double)m->h0[i * D + k] * W[k * D + o];
            m->h1[i * D + o] = (float)tanh(s);
        }
    return 0;
}

static int mid_backward(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    model_t *m = mp;
    const float *W = c->params[0];
    float *dW = c->grads[0], *db = c->grads[1];
    check_fresh(m, c);
    zero_fresh(m, c, dW, D * D);
    zero_fresh(m, c, db, D);
    for (int i = 0; i < B * D; i++)
        m->dh0[i] = 0;
    for (int i = 0; i < B; i++)
        for (int o = 0; o < D; o++) {
            float da = m->dh1[i * D + o] * (1 - m->h1[i * D + o] * m->h1[i * D + o]);
            db[o] += da;
            for (int k = 0; k < D; k++) {
                dW[k * D + o] += m->h0[i * D + k] * da;
                m->dh0[i * D + k] += da * W[k * D + o];
            }
        }
    return 0;
}

/* ------------------------------------------------------------ the reference (fp64) */

/* Gradients of the mean over world x accum micro-batches of step `step`, from
 * parameters wte (V,D), W (D,D), b (D). gwte_use[0] / [1]: the embedding's and
 * the head's contributions to wte's gradient, apart. Returns the mean loss. */
static double reference(int step, int world, int accum, const double *wte, const double *W,
                        const double *b, double *gwte_use[2], double *gW, double *gb)
{
    memset(gwte_use[0], 0, sizeof(double) * V * D);
    memset(gwte_use[1], 0, sizeof(double) * V * D);
    memset(gW, 0, sizeof(double) * D * D);
    memset(gb, 0, sizeof(double) * D);
    const int n = world * accum;
    double loss = 0;
    for (int g = 0; g < n; g++) {
        int32_t x[B], t[B];
        double h0[B][D], h1[B][D], p[B][V], dh1[B][D], dh0[B][D];
        batch(step, g, x, t);
        for (int i = 0; i < B; i++) {
            for (int k = 0; k < D; k++)
                h0[i][k] = wte[x[i] * D + k];
            for (int o = 0; o < D; o++) {
                double s = b[o];
                for (int k = 0; k < D; k++)
                    s += h0[i][k] * W[k * D + o];
                h1[i][o] = tanh(s);
            }
            double mx = -INFINITY, z = 0;
            for (int v = 0; v < V; v++) {
                double s = 0;
                for (int k = 0; k < D; k++)
                    s += h1[i][k] * wte[v * D + k];
                p[i][v] = s;
                mx = s > mx ? s : mx;
            }
            for (int v = 0; v < V; v++)
                z += exp(p[i][v] - mx);
            for (int v = 0; v < V; v++)
                p[i][v] = exp(p[i][v] - mx) / z;
            loss -= log(p[i][t[i]]) / B / n;
        }
        for (int i = 0; i < B; i++) {
            for (int k = 0; k < D; k++)
                dh1[i][k] = 0;
            for (int v = 0; v < V; v++) {
                double dl = (p[i][v] - (v == t[i])) / B / n;
                for (int k = 0; k < D; k++) {
                    gwte_use[1][v * D + k] += dl * h1[i][k];
                    dh1[i][k] += dl * wte[v * D + k];
                }
            }
            for (int k = 0; k < D; k++)
                dh0[i][k] = 0;
            for (int o = 0; o < D; o++) {
                double da = dh1[i][o] * (1 - h1[i][o] * h1[i][o]);
                gb[o] += da;
                for (int k = 0; k < D; k++) {
                    gW[k * D + o] += h0[i][k] * da;
                    dh0[i][k] += da * W[k * D + o];
                }
            }
            for (int k = 0; k < D; k++)
                gwte_use[0][x[i] * D + k] += dh0[i][k];
        }
    }
    return loss;
}

/* ------------------------------------------------------------ main */

static double max_abs(const double *a, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

/* max |(p0 - p1) - g| / max |g|: how far the step's move is from -g. */
static double move_error(const double *p0, const float *p1, const double *g, int n)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((p0[i] - (double)p1[i]) - g[i]);
        worst = e > worst ? e : worst;
    }
    return worst / max_abs(g, n);
}

static int usage(void)
{
    fprintf(stderr, "usage: tied_check [--zero 2|3] [--ckpt 0|1] [--prefetch 0|1] [--accum A] "
                    "[--overwrite 0|1]\n");
    return 2;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        return 1;                                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    int accum = 2, overwrite = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            return usage();
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--zero") == 0 && (v == 2 || v == 3))
            lc.zero_level = v;
        else if (strcmp(argv[i], "--ckpt") == 0 && (v == 0 || v == 1))
            lc.checkpointing = v;
        else if (strcmp(argv[i], "--prefetch") == 0 && (v == 0 || v == 1))
            lc.prefetch = v;
        else if (strcmp(argv[i], "--accum") == 0 && v >= 1 && v <= 8)
            accum = v;
        else if (strcmp(argv[i], "--overwrite") == 0 && (v == 0 || v == 1))
            overwrite = v;
        else
            return usage();
        i++;
    }
    bmt_ctx_t *ctx = NULL;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0)
        DIE("tied_check: %s", err.text);
    my_rank = bmt_rank(ctx);
    if (bmt_device(ctx) != BMT_DEVICE_CPU)
        DIE("tied_check: runs on cpu only (its callbacks compute on the host)");
    model_t *m = calloc(1, sizeof(*m));
    m->ctx = ctx;
    m->world = bmt_world_size(ctx);
    m->rank = my_rank;
    m->overwrite = overwrite != 0;
    m->gpg = bmt_layout(ctx)->gpus_per_group;

    bmt_block_t *emb = bmt_block_create(ctx, "emb", &err), *mid = NULL;
    const int64_t swte[2] = { V, D }, sW[2] = { D, D }, sb[1] = { D };
    if (emb == NULL ||
        bmt_block_add_param(emb, "wte.weight", 2, swte, BMT_F32, WTE_INIT, 0, &err) < 0 ||
        bmt_block_build(emb, SEED, &err) < 0 ||
        (mid = bmt_block_create(ctx, "mid", &err)) == NULL ||
        bmt_block_add_param(mid, "fc.weight", 2, sW, BMT_F32, W_INIT, 0, &err) < 0 ||
        bmt_block_add_param(mid, "fc.bias", 1, sb, BMT_F32, B_INIT, BMT_PARAM_NO_DECAY, &err) < 0 ||
        bmt_block_build(mid, SEED, &err) < 0)
        DIE("tied_check: %s", err.text);
    bmt_blocklist_t *list = bmt_blocklist_create(ctx, &lc, &err);
    const bmt_block_ops_t eops = { emb_forward, emb_backward },
                          mops = { mid_forward, mid_backward };
    if (list == NULL || bmt_blocklist_append(list, emb, &eops, m, &err) < 0 ||
        bmt_blocklist_append(list, mid, &mops, m, &err) < 0 ||
        bmt_blocklist_set_grad_overwrite(list, m->overwrite, &err) < 0)
        DIE("tied_check: %s", err.text);

    /* Misuse first: each refused, the list unchanged. */
    bmt_block_t *stray = bmt_block_create(ctx, "stray", &err);
    bmt_block_add_param(stray, "w", 1, sb, BMT_F32, W_INIT, 0, &err);
    bmt_block_build(stray, SEED, &err);
    int rc = bmt_blocklist_append_tied(list, stray, &eops, m, &err);
    check(rc < 0 && strstr(err.text, "is not in this block list") && bmt_blocklist_size(list) == 2,
          "tying a block that is not in the list is refused: \"%s\"", err.text);
    bmt_block_destroy(stray);
    rc = bmt_blocklist_append(list, emb, &eops, m, &err);
    check(rc < 0 && bmt_blocklist_size(list) == 2,
          "appending a block twice (untied) is still refused: \"%s\"", err.text);
    if (bmt_blocklist_append_tied(list, emb, &eops, m, &err) < 0)
        DIE("tied_check: %s", err.text);
    rc = bmt_blocklist_append_tied(list, emb, &eops, m, &err);
    check(rc < 0 && strstr(err.text, "already tied") && bmt_blocklist_size(list) == 3,
          "tying a block a second time is refused: \"%s\"", err.text);
    check(bmt_blocklist_size(list) == 3 && bmt_blocklist_block(list, 2) == emb &&
              bmt_blocklist_block(list, 0) == emb,
          "the list has 3 uses; uses 0 and 2 are the same block");

    bmt_adamw_config_t oc = BMT_ADAMW_CONFIG_INITIALIZER;
    oc.lr = 1e6;
    oc.eps = 1e6;
    oc.weight_decay = 0;
    bmt_optim_t *opt = bmt_adamw_create(list, &oc, &err);
    if (opt == NULL)
        DIE("tied_check: %s", err.text);
    rc = bmt_blocklist_append_tied(list, mid, &mops, m, &err);
    check(rc < 0 && strstr(err.text, "before the first forward"),
          "tying after the optimizer sealed the list is refused: \"%s\"", err.text);

    /* The reference starts from the same initial values. */
    double *wte0 = malloc(sizeof(double) * V * D), *W0 = malloc(sizeof(double) * D * D), b0[D];
    for (int i = 0; i < V * D; i++)
        wte0[i] = (float)bmt_init_value(SEED, "emb.wte.weight", (uint64_t)i, &WTE_INIT);
    for (int i = 0; i < D * D; i++)
        W0[i] = (float)bmt_init_value(SEED, "mid.fc.weight", (uint64_t)i, &W_INIT);
    for (int i = 0; i < D; i++)
        b0[i] = (float)bmt_init_value(SEED, "mid.fc.bias", (uint64_t)i, &B_INIT);
    double *gu[2] = { malloc(sizeof(double) * V * D), malloc(sizeof(double) * V * D) };
    double *gwte = malloc(sizeof(double) * V * D), *gW = malloc(sizeof(double) * D * D), gb[D];
    double ref_loss = reference(1, m->world, accum, wte0, W0, b0, gu, gW, gb);
    for (int i = 0; i < V * D; i++)
        gwte[i] = gu[0][i] + gu[1][i];

    bmt_mem_reset_peaks(ctx);
    bmt_step_info_t info;
    for (int s = 1; s <= 3; s++) {
        m->step = s;
        double loss = 0;
        for (int a = 0; a < accum; a++) {
            if (bmt_blocklist_forward(list, &err) < 0 ||
                bmt_blocklist_backward(list, a == accum - 1, &err) < 0)
                DIE("tied_check: step %d: %s", s, err.text);
            loss += m->loss;
        }
        if (bmt_optim_step(opt, &info, &err) < 0)
            DIE("tied_check: step %d: %s", s, err.text);
        if (s > 1)
            continue;
        bmt_mem_stats_t st;
        bmt_mem_get_stats(ctx, &st);
        /* Each gathered buffer is its block's full buffer (f32 elements padded
         * to 16 x group size, in 256 bytes): emb's V x D, mid's W and b (b at
         * the next multiple of BMT_BLOCK_ALIGN). Zero 3 with prefetch holds two
         * neighbours (emb and mid) at most, without prefetch one block at a time
         * (emb the larger); zero 2 one per block, the tied uses sharing emb's.
         * Buffers sized for the largest block would make the first two 2 x emb. */
        const int P = bmt_layout(ctx)->gpus_per_group, pad = 16 * P;
        const size_t mid_n = (D * D + BMT_BLOCK_ALIGN - 1) / BMT_BLOCK_ALIGN * BMT_BLOCK_ALIGN + D;
        const size_t emb_full =
            (((size_t)(V * D + pad - 1) / pad * pad) * sizeof(float) + 255) / 256 * 256;
        const size_t mid_full = ((mid_n + pad - 1) / pad * pad * sizeof(float) + 255) / 256 * 256;
        const bool two = lc.zero_level == 2 || lc.prefetch;
        /* A group of one computes on its shards in place: nothing is gathered. */
        const size_t want = P == 1 ? 0 : two ? emb_full + mid_full : emb_full;
        check(st.peak[BMT_MEM_GATHERED] == want,
              "step 1: gathered buffers peaked at %llu bytes = %s = %zu (each its block's size; "
              "the tied uses share; none in a group of one)",
              (unsigned long long)st.peak[BMT_MEM_GATHERED],
              P == 1 ? "none"
              : two  ? "emb + mid"
                     : "emb",
              want);
        /* The full gradient buffers (groups of more than one) are sized per
         * block too: the backward runs head (emb), mid, emb, so two of them
         * hold emb + mid at most (two of the largest would be 2 x emb), and
         * none is left once the backward is done. A group of one has none. */
        const size_t gwant = P > 1 ? emb_full + mid_full : 0;
        check(st.peak[BMT_MEM_GRAD_FULL] == gwant && st.current[BMT_MEM_GRAD_FULL] == 0,
              "step 1: full gradient buffers peaked at %llu bytes = %s = %zu, %llu after the "
              "step",
              (unsigned long long)st.peak[BMT_MEM_GRAD_FULL],
              P > 1 ? "emb + mid" : "none (a group of one)", gwant,
              (unsigned long long)st.current[BMT_MEM_GRAD_FULL]);
        /* Step 1 against the reference. */
        double norm = 0;
        for (int i = 0; i < V * D; i++)
            norm += gwte[i] * gwte[i];
        for (int i = 0; i < D * D; i++)
            norm += gW[i] * gW[i];
        for (int i = 0; i < D; i++)
            norm += gb[i] * gb[i];
        norm = sqrt(norm);
        check(fabs(info.grad_norm - norm) <= 1e-5 * norm,
              "step 1: grad norm %.9g, reference %.9g (bound 1e-5 relative)", info.grad_norm, norm);
        (void)loss;
        (void)ref_loss;
        float *p = malloc(sizeof(float) * V * D);
        if (bmt_block_gather(emb, &err) < 0 ||
            bmt_mem_download(ctx, p, bmt_block_param(emb, 0), sizeof(float) * V * D, &err) < 0 ||
            bmt_block_release(emb, &err) < 0)
            DIE("tied_check: %s", err.text);
        double e = move_error(wte0, p, gwte, V * D);
        double e0 = move_error(wte0, p, gu[0], V * D), e1 = move_error(wte0, p, gu[1], V * D);
        check(e <= 1e-4,
              "step 1: wte moved by -(embedding + head gradients): error %.2e (bound 1e-4)", e);
        check(e0 > 1e-2 && e1 > 1e-2,
              "step 1: either use's gradient alone would be caught (errors %.2e, %.2e)", e0, e1);
        float pw[D * D + D];
        if (bmt_block_gather(mid, &err) < 0 ||
            bmt_mem_download(ctx, pw, bmt_block_param(mid, 0), sizeof(float) * D * D, &err) < 0 ||
            bmt_mem_download(ctx, pw + D * D, bmt_block_param(mid, 1), sizeof(float) * D, &err) <
                0 ||
            bmt_block_release(mid, &err) < 0)
            DIE("tied_check: %s", err.text);
        double ew = move_error(W0, pw, gW, D * D), eb = move_error(b0, pw + D * D, gb, D);
        check(ew <= 1e-4 && eb <= 1e-4,
              "step 1: mid moved by -its gradients: errors %.2e, %.2e (bound 1e-4)", ew, eb);
        free(p);
    }
    check(!info.skipped && info.step == 3 && isfinite(info.grad_norm),
          "three steps ran (step %lld, grad norm %g)", (long long)info.step, info.grad_norm);
    check(m->bad_fresh == 0,
          "every backward call's grads_fresh as the header says (%d calls not; overwrite %d)",
          m->bad_fresh, (int)m->overwrite);
    bmt_optim_destroy(opt);
    bmt_blocklist_destroy(list);
    double all = failures; /* on cpu, device memory is host memory */
    if (bmt_all_reduce_host_f64(bmt_comm_world(ctx), &all, 1, BMT_SUM, &err) < 0)
        DIE("tied_check: %s", err.text);
    if (my_rank == 0)
        printf("tied_check: %s on %d ranks (zero %d, ckpt %d, prefetch %d, accum %d%s)\n",
               all ? "FAILED" : "all checks passed", m->world, lc.zero_level, lc.checkpointing,
               lc.prefetch, accum, m->overwrite ? ", overwrite" : "");
    free(wte0), free(W0), free(gu[0]), free(gu[1]), free(gwte), free(gW), free(m);
    bmt_finalize(ctx);
    return all ? 1 : 0;
}
