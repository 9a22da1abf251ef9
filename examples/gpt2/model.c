/* examples/gpt2/model.c — GPT-2's blocks and callbacks on the CPU (see model.h).
 *
 * The callbacks compute with the fp32 ops of nn/ops_cpu.c on the full parameters
 * the block list hands them (call->params, in the order the block added them)
 * and add gradients into call->grads. The residual stream flows between blocks
 * through the model's own buffers: x[l] is block l's input, dres the gradient
 * with respect to the output of the block whose backward runs next.
 *
 * Checkpointing (the list's config) decides where a layer's internals live: with
 * it, one scratch set shared by all layers, filled by the forward that the list
 * runs again inside backward; without it, one set per layer, filled once.
 *
 * The configuration (presets, checks, sizes, HF's config.json) is config.c's.
 */
#include "gpt2/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/device.h"
#include "bmt/safetensors.h"
#include "gpt2/model_cuda.h"
#include "nn/fp8.h"
#include "nn/ops_cuda.h" /* NN_GEMM_TUNE_MAX */
#include "nn/ops_cpu.h"

/* A layer's activations, all (B,T,...) row-major, f32. */
typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (N,C), (N), (N) */
    float *qkv;                       /* (N,3C) */
    float *preatt, *att;              /* (B,NH,T,T) */
    float *atty;                      /* (N,C): attention output, before c_proj */
    float *res2;                      /* (N,C): x + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd; /* (N,C), (N), (N) */
    float *fch, *fch_gelu;            /* (N,4C) */
} layer_acts_t;

struct gpt2_model {
    bmt_ctx_t *ctx;
    gpt2_config_t cfg;
    int B, T, N; /* N = B T rows */
    bool ckpt;
    int keep_from;      /* layers >= keep_from keep their activations (set l), the others
                         * are recomputed in set L: 0, or L under checkpointing, less after
                         * gpt2_model_keep_layers */
    nn_fp8_plan_t *fp8; /* gpt2_model_fp8: the layers' products emulated in FP8 (cpu), or NULL */
    int fp8_history;    /* its history (0: current scaling) */
    bmt_dtype_t pdtype; /* parameters: f32 on cpu, bf16 on cuda */
    gpt2_cu_t *cu;      /* the CUDA half (model_cuda.c), NULL on cpu */
    bmt_blocklist_t *list;
    int32_t *inputs, *targets; /* (B,T) of the current micro-batch */
    int counted;               /* targets >= 0 */
    float **x;                 /* (L+1) x (N,C): the residual stream, block inputs */
    layer_acts_t *acts;        /* L + 1 sets, those in use allocated (keep_from) */
    /* head */
    float *lnf, *lnf_mean, *lnf_rstd; /* (N,C), (N), (N) */
    float *logits, *probs, *losses;   /* (N,V), (N,V), (N) */
    float loss;
    /* backward scratch */
    float *dres, *dres2, *dln, *datty; /* (N,C) */
    float *dqkv;                       /* (N,3C) */
    float *dpreatt, *datt;             /* (B,NH,T,T) */
    float *dfch, *dfch_gelu;           /* (N,4C) */
    float *dlogits;                    /* (N,V) */
};

static int fail(bmt_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(bmt_error_t *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->text, sizeof(err->text), fmt, ap);
    va_end(ap);
    return -1;
}

/* ------------------------------------------------------------ callbacks */

/* Parameter order of a layer block, as layer_block() adds them. */
enum {
    P_LN1_W,
    P_LN1_B,
    P_ATTN_W,  /* (C,3C) */
    P_ATTN_B,  /* (3C) */
    P_APROJ_W, /* (C,C) */
    P_APROJ_B,
    P_LN2_W,
    P_LN2_B,
    P_FC_W,    /* (C,4C) */
    P_FC_B,    /* (4C) */
    P_FPROJ_W, /* (4C,C) */
    P_FPROJ_B,
    P_LAYER_COUNT
};
/* ... and of the "transformer" block. */
enum {
    P_WTE,
    P_WPE,
    P_LNF_W,
    P_LNF_B
};

static layer_acts_t *acts_of(gpt2_model_t *m, int l)
{
    return &m->acts[l >= m->keep_from ? l : m->cfg.n_layer];
}

/* A layer's product: f32, or (gpt2_model_fp8) its operands through FP8 as on
 * the GPU (nn/fp8.h). An operand FP8 cannot scale (NaN or infinite values)
 * gives NaN results, so the step is handled as any non-finite one (skipped). */
static const char *const PRODUCT[4] = { "c_attn", "attn.c_proj", "c_fc", "mlp.c_proj" };

static nn_fp8_scaling_t *scaling(gpt2_model_t *m, int l, int k)
{
    return m->fp8 ? nn_fp8_plan_at(m->fp8, 4 * l + k) : NULL;
}

static int fp8_oom(int l, int k, const char *what, bmt_error_t *err)
{
    snprintf(err->text, sizeof(err->text),
             "gpt2: layer %d %s%s: FP8: out of memory for its operands' copies", l, PRODUCT[k],
             what);
    return -1;
}

static int linear_fwd(gpt2_model_t *m, int l, int k, float *out, const float *inp, const float *w,
                      const float *b, int IC, int OC, bmt_error_t *err)
{
    return nn_linear_forward(scaling(m, l, k), out, inp, w, b, m->N, IC, OC, 0) < 0
               ? fp8_oom(l, k, "", err)
               : 0;
}

static int linear_bwd(gpt2_model_t *m, int l, int k, float *dinp, float *dw, float *db,
                      const float *dout, const float *inp, const float *w, int IC, int OC,
                      bmt_error_t *err)
{
    return nn_linear_backward(scaling(m, l, k), dinp, dw, db, dout, inp, w, m->N, IC, OC, 0) < 0
               ? fp8_oom(l, k, " backward", err)
               : 0;
}

static int layer_forward(gpt2_model_t *m, int l, const float *const *p, bmt_error_t *err)
{
    const int N = m->N, C = m->cfg.n_embd;
    layer_acts_t *a = acts_of(m, l);
    const float *x = m->x[l];
    float *out = m->x[l + 1];
    nn_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p[P_LN1_W], p[P_LN1_B], N, C);
    if (linear_fwd(m, l, 0, a->qkv, a->ln1, p[P_ATTN_W], p[P_ATTN_B], C, 3 * C, err) < 0)
        return -1;
    nn_attention_qkv_forward(a->atty, a->preatt, a->att, a->qkv, m->B, m->T, C, m->cfg.n_head);
    /* out as a temporary */
    if (linear_fwd(m, l, 1, out, a->atty, p[P_APROJ_W], p[P_APROJ_B], C, C, err) < 0)
        return -1;
    nn_residual_forward(a->res2, x, out, N * C);
    nn_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p[P_LN2_W], p[P_LN2_B], N, C);
    if (linear_fwd(m, l, 2, a->fch, a->ln2, p[P_FC_W], p[P_FC_B], C, 4 * C, err) < 0)
        return -1;
    nn_gelu_forward(a->fch_gelu, a->fch, N * 4 * C);
    if (linear_fwd(m, l, 3, out, a->fch_gelu, p[P_FPROJ_W], p[P_FPROJ_B], 4 * C, C, err) < 0)
        return -1;
    nn_residual_forward(out, a->res2, out, N * C);
    return 0;
}

/* dres: in, the gradient w.r.t. x[l+1]; out, w.r.t. x[l]. */
static int layer_backward(gpt2_model_t *m, int l, const float *const *p, float *const *g,
                          bmt_error_t *err)
{
    const int N = m->N, C = m->cfg.n_embd;
    layer_acts_t *a = acts_of(m, l);
    const size_t nc = (size_t)N * C * sizeof(float);
    memcpy(m->dres2, m->dres, nc); /* the residual path: d res2 = d out + ... */
    memset(m->dfch_gelu, 0, (size_t)N * 4 * C * sizeof(float));
    if (linear_bwd(m, l, 3, m->dfch_gelu, g[P_FPROJ_W], g[P_FPROJ_B], m->dres, a->fch_gelu,
                   p[P_FPROJ_W], 4 * C, C, err) < 0)
        return -1;
    memset(m->dfch, 0, (size_t)N * 4 * C * sizeof(float));
    nn_gelu_backward(m->dfch, a->fch, m->dfch_gelu, N * 4 * C);
    memset(m->dln, 0, nc);
    if (linear_bwd(m, l, 2, m->dln, g[P_FC_W], g[P_FC_B], m->dfch, a->ln2, p[P_FC_W], C, 4 * C,
                   err) < 0)
        return -1;
    nn_layernorm_backward(m->dres2, g[P_LN2_W], g[P_LN2_B], m->dln, a->res2, p[P_LN2_W],
                          a->ln2_mean, a->ln2_rstd, N, C);
    memcpy(m->dres, m->dres2, nc); /* d x = d res2 + ... */
    memset(m->datty, 0, nc);
    if (linear_bwd(m, l, 1, m->datty, g[P_APROJ_W], g[P_APROJ_B], m->dres2, a->atty, p[P_APROJ_W],
                   C, C, err) < 0)
        return -1;
    memset(m->dqkv, 0, (size_t)N * 3 * C * sizeof(float));
    nn_attention_qkv_backward(m->dqkv, m->dpreatt, m->datt, m->datty, a->qkv, a->att, m->B, m->T, C,
                              m->cfg.n_head);
    memset(m->dln, 0, nc);
    if (linear_bwd(m, l, 0, m->dln, g[P_ATTN_W], g[P_ATTN_B], m->dqkv, a->ln1, p[P_ATTN_W], C,
                   3 * C, err) < 0)
        return -1;
    nn_layernorm_backward(m->dres, g[P_LN1_W], g[P_LN1_B], m->dln, m->x[l], p[P_LN1_W], a->ln1_mean,
                          a->ln1_rstd, N, C);
    return 0;
}

static void head_forward(gpt2_model_t *m, const float *const *p)
{
    const int N = m->N, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    nn_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->x[m->cfg.n_layer], p[P_LNF_W],
                         p[P_LNF_B], N, C);
    nn_conv1d_forward(m->logits, m->lnf, p[P_WTE], NULL, N, C, V, 1);
    nn_crossentropy_forward(m->losses, m->probs, m->logits, m->targets, m->B, m->T, V);
    double sum = 0;
    for (int i = 0; i < N; i++)
        if (m->targets[i] >= 0)
            sum += m->losses[i];
    m->loss = m->counted ? (float)(sum / m->counted) : 0.0f;
}

static void head_backward(gpt2_model_t *m, const float *const *p, float *const *g)
{
    const int N = m->N, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    memset(m->dlogits, 0, (size_t)N * V * sizeof(float));
    if (m->counted)
        nn_crossentropy_backward(m->dlogits, m->probs, m->targets, 1.0f / (float)m->counted, m->B,
                                 m->T, V);
    memset(m->dln, 0, (size_t)N * C * sizeof(float));
    nn_conv1d_backward(m->dln, g[P_WTE], NULL, m->dlogits, m->lnf, p[P_WTE], N, C, V, 1);
    memset(m->dres, 0, (size_t)N * C * sizeof(float));
    nn_layernorm_backward(m->dres, g[P_LNF_W], g[P_LNF_B], m->dln, m->x[m->cfg.n_layer], p[P_LNF_W],
                          m->lnf_mean, m->lnf_rstd, N, C);
}

/* The "transformer" block: use 0 embeds, use L+1 is the head. */
static int top_forward(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    gpt2_model_t *m = mp;
    if (m->cu)
        return gpt2_cu_forward(m->cu, c, err);
    const float *const *p = (const float *const *)c->params;
    if (c->index == 0 && m->fp8 && !c->recompute)
        nn_fp8_plan_begin(m->fp8); /* a pass begins (nn_fp8_plan_t) */
    if (c->index == 0)
        nn_encoder_forward(m->x[0], m->inputs, p[P_WTE], p[P_WPE], m->B, m->T, m->cfg.n_embd);
    else
        head_forward(m, p);
    return 0;
}

static int top_backward(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    gpt2_model_t *m = mp;
    if (m->cu)
        return gpt2_cu_backward(m->cu, c, err);
    const float *const *p = (const float *const *)c->params;
    float *const *g = (float *const *)c->grads;
    if (c->index == 0) {
        nn_encoder_backward(g[P_WTE], g[P_WPE], m->dres, m->inputs, m->B, m->T, m->cfg.n_embd);
        if (m->fp8)
            nn_fp8_plan_end(m->fp8);
    } else
        head_backward(m, p, g);
    return 0;
}

static int layer_fwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    gpt2_model_t *m = mp;
    if (m->cu)
        return gpt2_cu_forward(m->cu, c, err);
    return layer_forward(mp, c->index - 1, (const float *const *)c->params, err);
}

static int layer_bwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    gpt2_model_t *m = mp;
    if (m->cu)
        return gpt2_cu_backward(m->cu, c, err);
    return layer_backward(mp, c->index - 1, (const float *const *)c->params,
                          (float *const *)c->grads, err);
}

/* ------------------------------------------------------------ construction */

static bmt_block_t *top_block(gpt2_model_t *m, uint64_t seed, bmt_error_t *err)
{
    const int64_t V = m->cfg.vocab_size, C = m->cfg.n_embd, maxT = m->cfg.max_seq_len;
    const int64_t swte[2] = { V, C }, swpe[2] = { maxT, C }, sc[1] = { C };
    const bmt_init_t w = BMT_INIT_NORMAL_V(0, 0.02);
    bmt_block_t *b = bmt_block_create(m->ctx, "transformer", err);
    if (b == NULL || bmt_block_add_param(b, "wte.weight", 2, swte, m->pdtype, w, 0, err) < 0 ||
        bmt_block_add_param(b, "wpe.weight", 2, swpe, m->pdtype, w, 0, err) < 0 ||
        bmt_block_add_param(b, "ln_f.weight", 1, sc, m->pdtype, BMT_INIT_ONES_V, BMT_PARAM_NO_DECAY,
                            err) < 0 ||
        bmt_block_add_param(b, "ln_f.bias", 1, sc, m->pdtype, BMT_INIT_ZEROS_V, BMT_PARAM_NO_DECAY,
                            err) < 0 ||
        bmt_block_build(b, seed, err) < 0) {
        bmt_block_destroy(b);
        return NULL;
    }
    return b;
}

static bmt_block_t *layer_block(gpt2_model_t *m, int l, uint64_t seed, bmt_error_t *err)
{
    const int64_t C = m->cfg.n_embd;
    const bmt_init_t w = BMT_INIT_NORMAL_V(0, 0.02);
    const bmt_init_t wp = BMT_INIT_NORMAL_V(0, 0.02 / sqrt(2.0 * m->cfg.n_layer));
    const bmt_init_t one = BMT_INIT_ONES_V, zero = BMT_INIT_ZEROS_V;
    const unsigned nd = BMT_PARAM_NO_DECAY;
    const struct {
        const char *name;
        int ndim;
        int64_t d0, d1;
        bmt_init_t init;
        unsigned flags;
    } ps[P_LAYER_COUNT] = {
        { "ln_1.weight", 1, C, 0, one, nd },         { "ln_1.bias", 1, C, 0, zero, nd },
        { "attn.c_attn.weight", 2, C, 3 * C, w, 0 }, { "attn.c_attn.bias", 1, 3 * C, 0, zero, nd },
        { "attn.c_proj.weight", 2, C, C, wp, 0 },    { "attn.c_proj.bias", 1, C, 0, zero, nd },
        { "ln_2.weight", 1, C, 0, one, nd },         { "ln_2.bias", 1, C, 0, zero, nd },
        { "mlp.c_fc.weight", 2, C, 4 * C, w, 0 },    { "mlp.c_fc.bias", 1, 4 * C, 0, zero, nd },
        { "mlp.c_proj.weight", 2, 4 * C, C, wp, 0 }, { "mlp.c_proj.bias", 1, C, 0, zero, nd },
    };
    char name[64];
    snprintf(name, sizeof(name), "transformer.h.%d", l);
    bmt_block_t *b = bmt_block_create(m->ctx, name, err);
    if (b == NULL)
        return NULL;
    for (int i = 0; i < P_LAYER_COUNT; i++) {
        const int64_t shape[2] = { ps[i].d0, ps[i].d1 };
        if (bmt_block_add_param(b, ps[i].name, ps[i].ndim, shape, m->pdtype, ps[i].init,
                                ps[i].flags, err) < 0) {
            bmt_block_destroy(b);
            return NULL;
        }
    }
    if (bmt_block_build(b, seed, err) < 0) {
        bmt_block_destroy(b);
        return NULL;
    }
    return b;
}

/* One activation buffer of n floats, counted as BMT_MEM_ACTIVATION. */
static float *act(gpt2_model_t *m, size_t n, bmt_error_t *err)
{
    return bmt_alloc(m->ctx, BMT_MEM_ACTIVATION, n * sizeof(float), err);
}

/* Whether set i is in use when layers keep_from.. keep theirs: a kept
 * layer's (i < L), or the scratch (i == L) when some layer is recomputed. */
static bool set_used(const gpt2_model_t *m, int keep_from, int i)
{
    return i < m->cfg.n_layer ? i >= keep_from : keep_from > 0;
}

/* A set's buffers with their floats: allocated (alloc), freed, or counted
 * (the return value, with neither). */
static size_t set_bufs(gpt2_model_t *m, layer_acts_t *a, bool alloc, bool release, int *rc,
                       bmt_error_t *err)
{
    const size_t N = (size_t)m->N, C = (size_t)m->cfg.n_embd;
    const size_t att = (size_t)m->B * m->cfg.n_head * m->T * m->T;
    float **bufs[] = { &a->ln1,      &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->preatt,
                       &a->att,      &a->atty,     &a->res2,     &a->ln2, &a->ln2_mean,
                       &a->ln2_rstd, &a->fch,      &a->fch_gelu };
    const size_t n[] = { N * C, N,     N, N * 3 * C, att,       att,      N * C,
                         N * C, N * C, N, N,         N * 4 * C, N * 4 * C };
    _Static_assert(sizeof(bufs) / sizeof(bufs[0]) == sizeof(n) / sizeof(n[0]),
                   "a size for every buffer");
    size_t total = 0;
    for (size_t j = 0; j < sizeof(n) / sizeof(n[0]); j++) {
        total += n[j];
        if (alloc && *rc == 0 && (*bufs[j] = act(m, n[j], err)) == NULL)
            *rc = -1;
        if (release) {
            bmt_free(m->ctx, *bufs[j]);
            *bufs[j] = NULL;
        }
    }
    return total;
}

static int alloc_acts(gpt2_model_t *m, bmt_error_t *err)
{
    const size_t N = (size_t)m->N, C = (size_t)m->cfg.n_embd, V = (size_t)m->cfg.vocab_size;
    const size_t att = (size_t)m->B * m->cfg.n_head * m->T * m->T;
    const int L = m->cfg.n_layer;
    m->x = calloc((size_t)L + 1, sizeof(float *));
    m->acts = calloc((size_t)L + 1, sizeof(layer_acts_t));
    if (!m->x || !m->acts)
        return fail(err, "rank %d: out of memory for the model's activations", bmt_rank(m->ctx));
    for (int l = 0; l <= L; l++)
        if ((m->x[l] = act(m, N * C, err)) == NULL)
            return -1;
    int rc = 0;
    for (int s = 0; s <= L && rc == 0; s++)
        if (set_used(m, m->keep_from, s))
            set_bufs(m, &m->acts[s], true, false, &rc, err);
    if (rc < 0)
        return -1;
    if (!(m->lnf = act(m, N * C, err)) || !(m->lnf_mean = act(m, N, err)) ||
        !(m->lnf_rstd = act(m, N, err)) || !(m->logits = act(m, N * V, err)) ||
        !(m->probs = act(m, N * V, err)) || !(m->losses = act(m, N, err)) ||
        !(m->dres = act(m, N * C, err)) || !(m->dres2 = act(m, N * C, err)) ||
        !(m->dln = act(m, N * C, err)) || !(m->datty = act(m, N * C, err)) ||
        !(m->dqkv = act(m, N * 3 * C, err)) || !(m->dpreatt = act(m, att, err)) ||
        !(m->datt = act(m, att, err)) || !(m->dfch = act(m, N * 4 * C, err)) ||
        !(m->dfch_gelu = act(m, N * 4 * C, err)) || !(m->dlogits = act(m, N * V, err)))
        return -1;
    return 0;
}

gpt2_model_t *gpt2_model_create(bmt_ctx_t *ctx, const gpt2_config_t *cfg, int B, int T,
                                const bmt_blocklist_config_t *list_cfg, uint64_t seed,
                                bmt_error_t *err)
{
    if (gpt2_config_check(cfg, err) < 0)
        return NULL;
    if (B < 1 || T < 1 || T > cfg->max_seq_len || (int64_t)B * T > (1 << 24)) {
        fail(err, "model: micro-batch %d x sequence length %d: need B >= 1 and 1 <= T <= %d", B, T,
             cfg->max_seq_len);
        return NULL;
    }
    gpt2_model_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        fail(err, "out of memory");
        return NULL;
    }
    m->pdtype = bmt_device(ctx) == BMT_DEVICE_CUDA ? BMT_BF16 : BMT_F32;
    m->inputs = calloc((size_t)B * T, sizeof(int32_t));
    m->targets = calloc((size_t)B * T, sizeof(int32_t));
    if (!m->inputs || !m->targets) {
        free(m->inputs);
        free(m->targets);
        free(m);
        fail(err, "out of memory");
        return NULL;
    }
    m->ctx = ctx;
    m->cfg = *cfg;
    m->B = B, m->T = T, m->N = B * T;
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    if (list_cfg)
        lc = *list_cfg;
    m->ckpt = lc.checkpointing != 0;
    m->keep_from = m->ckpt ? cfg->n_layer : 0;
    static const bmt_block_ops_t top_ops = { top_forward, top_backward };
    static const bmt_block_ops_t layer_ops = { layer_fwd_cb, layer_bwd_cb };
    bmt_block_t *top = NULL;
    if ((m->list = bmt_blocklist_create(ctx, &lc, err)) == NULL ||
        (top = top_block(m, seed, err)) == NULL)
        goto fail;
    if (bmt_blocklist_append(m->list, top, &top_ops, m, err) < 0) {
        bmt_block_destroy(top);
        goto fail;
    }
    for (int l = 0; l < cfg->n_layer; l++) {
        bmt_block_t *b = layer_block(m, l, seed, err);
        if (b == NULL)
            goto fail;
        if (bmt_blocklist_append(m->list, b, &layer_ops, m, err) < 0) {
            bmt_block_destroy(b);
            goto fail;
        }
    }
    if (bmt_blocklist_append_tied(m->list, top, &top_ops, m, err) < 0)
        goto fail;
    if (m->pdtype == BMT_BF16 ? (m->cu = gpt2_cu_create(ctx, cfg, B, T, m->ckpt, err)) == NULL
                              : alloc_acts(m, err) < 0)
        goto fail;
    /* The CUDA callbacks write fresh gradients (products with beta 0): the
     * list need not zero them first. */
    if (m->cu && bmt_blocklist_set_grad_overwrite(m->list, true, err) < 0)
        goto fail;
    return m;
fail:
    gpt2_model_destroy(m);
    return NULL;
}

bmt_blocklist_t *gpt2_model_list(gpt2_model_t *m) { return m ? m->list : NULL; }

int gpt2_model_set_batch(gpt2_model_t *m, const int32_t *inputs, const int32_t *targets,
                         bmt_error_t *err)
{
    const int V = m->cfg.vocab_size;
    int counted = 0;
    for (int i = 0; i < m->N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return fail(err,
                        "model: input token %d at position %d is outside the vocabulary [0, %d)",
                        inputs[i], i, V);
        if (targets[i] >= V)
            return fail(err,
                        "model: target token %d at position %d is outside the vocabulary [0, %d)",
                        targets[i], i, V);
        counted += targets[i] >= 0;
    }
    if (m->cu && gpt2_cu_set_batch(m->cu, inputs, targets, counted, err) < 0)
        return -1;
    memcpy(m->inputs, inputs, (size_t)m->N * sizeof(int32_t));
    memcpy(m->targets, targets, (size_t)m->N * sizeof(int32_t));
    m->counted = counted;
    return 0;
}

float gpt2_model_loss(const gpt2_model_t *m)
{
    if (m->cu) {
        bmt_error_t err;
        float loss;
        if (gpt2_cu_loss(m->cu, &loss, &err) < 0) {
            fprintf(stderr, "gpt2: rank %d: %s\n", bmt_rank(m->ctx), err.text);
            return NAN;
        }
        return loss;
    }
    return m->loss;
}

int gpt2_model_keep_logits(gpt2_model_t *m, bmt_error_t *err)
{
    return m->cu ? gpt2_cu_keep_logits(m->cu, err) : 0;
}

int gpt2_model_keep_attention(gpt2_model_t *m, int mode, bmt_error_t *err)
{
    if (mode > 0 && m->cu == NULL) {
        snprintf(err->text, sizeof(err->text),
                 "gpt2: keeping the attention outputs through checkpointing is for the cuda "
                 "model (--device cuda); the cpu model recomputes its layers whole");
        return -1;
    }
    return m->cu ? gpt2_cu_keep_attention(m->cu, mode, err) : 0;
}

int gpt2_model_act_bytes(const gpt2_model_t *m, int64_t *layer, int64_t *head)
{
    if (m->cu) {
        gpt2_cu_act_bytes(m->cu, layer, head);
    } else { /* a set's floats; the cpu head keeps its logits whole always */
        layer_acts_t a = { 0 };
        *layer =
            (int64_t)(set_bufs((gpt2_model_t *)m, &a, false, false, NULL, NULL) * sizeof(float));
        *head = 0;
    }
    return m->cfg.n_layer;
}

int gpt2_model_keep_layers(gpt2_model_t *m, int layers, bool head, bmt_error_t *err)
{
    const int L = m->cfg.n_layer;
    if (!m->ckpt)
        return fail(err, "keeping layers' activations is selective checkpointing: the model was "
                         "made without checkpointing (every layer keeps them already)");
    if (layers < 0 || layers > L)
        return fail(err, "%d layers cannot keep their activations: the model has %d", layers, L);
    /* Refused after the first forward before anything changes (setting use
     * 1 to what it is), then this model's sets (cpu: the new ones first, so
     * that running out of memory leaves everything as it was), then the list:
     * layer l is use l + 1, the head (the embedding's tied use) the last. */
    if (bmt_blocklist_set_checkpointing(m->list, 1, bmt_blocklist_checkpointing(m->list, 1), err) <
        0)
        return -1;
    if (m->cu) {
        if (gpt2_cu_keep_layers(m->cu, L - layers, head, err) < 0)
            return -1;
    } else {
        const int was = m->keep_from, now = L - layers;
        int rc = 0;
        for (int i = 0; i <= L && rc == 0; i++)
            if (!set_used(m, was, i) && set_used(m, now, i))
                set_bufs(m, &m->acts[i], true, false, &rc, err);
        if (rc < 0) { /* give back what came, keep what was */
            for (int i = 0; i <= L; i++)
                if (!set_used(m, was, i) && set_used(m, now, i))
                    set_bufs(m, &m->acts[i], false, true, NULL, NULL);
            return -1;
        }
        for (int i = 0; i <= L; i++)
            if (set_used(m, was, i) && !set_used(m, now, i))
                set_bufs(m, &m->acts[i], false, true, NULL, NULL);
        m->keep_from = now;
    }
    for (int l = 0; l < L; l++)
        if (bmt_blocklist_set_checkpointing(m->list, l + 1, l < L - layers, err) < 0)
            return -1;
    return bmt_blocklist_set_checkpointing(m->list, L + 1, !head, err);
}

int gpt2_model_fp8(gpt2_model_t *m, int on, int history, bmt_error_t *err)
{
    if (history < 0 || history > NN_FP8_HISTORY_MAX)
        return fail(err, "gpt2: an FP8 history of %d passes: give 0 (current scaling) to %d",
                    history, NN_FP8_HISTORY_MAX);
    if (m->cu)
        return gpt2_cu_fp8(m->cu, on, history, err);
    if (m->fp8 && (!on || history != m->fp8_history))
        return fail(err, "gpt2: FP8 cannot be turned off or its scaling changed once on");
    if (!on || m->fp8)
        return 0;
    if ((m->fp8 = nn_fp8_plan_create(m->cfg.n_layer * 4, history)) == NULL)
        return fail(err, "gpt2: out of memory for the FP8 scales");
    m->fp8_history = history;
    return 0;
}

int gpt2_model_fp8_stats(gpt2_model_t *m, nn_fp8_stats_t *st, bmt_error_t *err)
{
    if (m->cu)
        return gpt2_cu_fp8_stats(m->cu, st, err);
    if (m->fp8)
        nn_fp8_plan_begin(m->fp8); /* closes the last pass, as a forward would */
    *st = m->fp8 ? nn_fp8_plan_stats(m->fp8) : (nn_fp8_stats_t){ 0, 0, 0 };
    return 0;
}

int gpt2_model_gemm_tune(gpt2_model_t *m, int candidates, bmt_error_t *err)
{
    if (candidates < 0 || candidates > NN_GEMM_TUNE_MAX) {
        snprintf(err->text, sizeof(err->text),
                 "gpt2: %d product candidates to time: give 0 (no timing) to %d", candidates,
                 NN_GEMM_TUNE_MAX);
        return -1;
    }
    return m->cu ? gpt2_cu_gemm_tune(m->cu, candidates, err) : 0;
}

const float *gpt2_model_logits(const gpt2_model_t *m)
{
    if (m->cu) {
        bmt_error_t err;
        const float *l = gpt2_cu_logits(m->cu, &err);
        if (l == NULL)
            fprintf(stderr, "gpt2: rank %d: %s\n", bmt_rank(m->ctx), err.text);
        return l;
    }
    return m->logits;
}

bmt_dtype_t gpt2_model_param_dtype(const gpt2_model_t *m) { return m->pdtype; }

void gpt2_model_destroy(gpt2_model_t *m)
{
    if (m == NULL)
        return;
    bmt_blocklist_destroy(m->list);
    gpt2_cu_destroy(m->cu);
    nn_fp8_plan_destroy(m->fp8);
    bmt_ctx_t *ctx = m->ctx;
    const int L = m->cfg.n_layer;
    if (m->x)
        for (int l = 0; l <= L; l++)
            bmt_free(ctx, m->x[l]);
    if (m->acts)
        for (int s = 0; s <= L; s++)
            set_bufs(m, &m->acts[s], false, true, NULL, NULL);
    float *rest[] = { m->lnf,  m->lnf_mean, m->lnf_rstd,  m->logits, m->probs, m->losses,
                      m->dres, m->dres2,    m->dln,       m->datty,  m->dqkv,  m->dpreatt,
                      m->datt, m->dfch,     m->dfch_gelu, m->dlogits };
    for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++)
        bmt_free(ctx, rest[i]);
    free(m->x);
    free(m->acts);
    free(m->inputs);
    free(m->targets);
    free(m);
}

/* ------------------------------------------------------------ safetensors */

/* The file's tensor for our parameter full_name: the same name, or without
 * the "transformer." prefix (HF's GPT-2 files use both). -1 when absent. */
static int find_tensor(const bmt_st_t *st, const char *full_name)
{
    int i = bmt_st_find(st, full_name);
    if (i < 0 && strncmp(full_name, "transformer.", 12) == 0)
        i = bmt_st_find(st, full_name + 12);
    return i;
}

typedef struct load_src {
    bmt_st_t *st;
    int *idx; /* (params of the block) tensor index of each */
} load_src_t;

static int read_param(void *user, const bmt_block_t *b, int param, int64_t first, int64_t count,
                      void *dst, bmt_dtype_t dtype, bmt_error_t *err)
{
    (void)b;
    const load_src_t *s = user;
    return bmt_st_read(s->st, s->idx[param], first, count, dst, dtype, err);
}

int gpt2_model_load(gpt2_model_t *m, const char *path, bmt_error_t *err)
{
    bmt_st_t *st = bmt_st_open(path, err);
    if (st == NULL)
        return -1;
    const int L = m->cfg.n_layer;
    int **idx = calloc((size_t)L + 1, sizeof(int *));
    int rc = idx ? 0 : fail(err, "out of memory");
    /* Every name and shape first, so that a mismatch loads nothing. */
    for (int u = 0; u <= L && rc == 0; u++) {
        const bmt_block_t *b = bmt_blocklist_block(m->list, u);
        const int n = bmt_block_num_params(b);
        if ((idx[u] = calloc((size_t)n, sizeof(int))) == NULL)
            rc = fail(err, "out of memory");
        for (int j = 0; j < n && rc == 0; j++) {
            const char *name = bmt_block_param_name(b, j);
            int i = idx[u][j] = find_tensor(st, name);
            const bmt_st_tensor_t *t = bmt_st_tensor(st, i);
            int ndim;
            int64_t shape[BMT_MAX_DIMS];
            bmt_block_param_shape(b, j, &ndim, shape);
            if (t == NULL) {
                rc = fail(err, "%.200s has no tensor '%.200s'%s%.200s%s", path, name,
                          strncmp(name, "transformer.", 12) == 0 ? " (nor '" : "",
                          strncmp(name, "transformer.", 12) == 0 ? name + 12 : "",
                          strncmp(name, "transformer.", 12) == 0 ? "')" : "");
                break;
            }
            bool same = t->ndim == ndim;
            for (int d = 0; same && d < ndim; d++)
                same = t->shape[d] == shape[d];
            if (!same) {
                char want[64] = "", got[64] = "";
                for (int d = 0; d < ndim; d++)
                    snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%lld",
                             d ? ", " : "", (long long)shape[d]);
                for (int d = 0; d < t->ndim; d++)
                    snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%lld", d ? ", " : "",
                             (long long)t->shape[d]);
                rc = fail(err, "%.150s: tensor '%.200s' is (%s); the model needs (%s)", t->file,
                          t->name, got, want);
            } else if (t->dtype != BMT_ST_F32 && t->dtype != BMT_ST_BF16 &&
                       t->dtype != BMT_ST_F16 && t->dtype != BMT_ST_F64)
                rc = fail(err, "%.150s: tensor '%.200s' is %s; a float type is needed", t->file,
                          t->name, bmt_st_dtype_name(t->dtype));
        }
    }
    for (int u = 0; u <= L && rc == 0; u++) {
        load_src_t src = { st, idx[u] };
        rc = bmt_block_load(bmt_blocklist_block(m->list, u), read_param, &src, err);
    }
    for (int u = 0; idx && u <= L; u++)
        free(idx[u]);
    free(idx);
    bmt_st_close(st);
    return rc;
}
