/* examples/llama/model.c — the Llama family's blocks, and their callbacks on the CPU (see model.h).
 *
 * Layer: an example, above libbmt (blocks, block list, safetensors reader) and
 * nn/ (the layers); it links nothing of examples/gpt2.
 *
 * The callbacks compute with the f32 layers of nn/llama_ops_cpu.h on the full
 * parameters the block list hands them (call->params, in the order the block
 * added them) and add gradients into call->grads (never overwrite: in a group
 * of one rank those are the gradient shards, holding earlier micro-batches and
 * the tied head's use). Activations flow between blocks through the model's own
 * buffers: x[l] is layer l's input, xf the head's; dres is the gradient with
 * respect to the output of the block whose backward runs next, dxf the head's.
 *
 * Checkpointing (the list's config) decides where a layer's internals live:
 * with it, one scratch set shared by all layers, filled again by the forward
 * that the list runs inside backward; without it, one set per layer, filled
 * once. Block inputs are kept either way, and recomputing a layer writes its
 * output x[l+1] again with the same bits.
 *
 * The loss: the head keeps the logits (N,V) and each row's log-sum-exp in
 * double, so llama_model_logits still holds the forward's values after the
 * backward, and the backward's softmax is exp(logit - lse) with no f32 sum.
 *
 * On a cuda context the parameters are bf16 (f32 masters in the optimizer),
 * the blocks get CUDA_OPS instead of CPU_OPS, and model_cuda.c computes every
 * use with its own activations; the CPU activations below are then not made.
 */
#include "llama/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/device.h"
#include "bmt/safetensors.h"
#include "llama/model_cuda.h"
#include "nn/fp8.h"
#include "nn/llama_ops_cpu.h"
#include "nn/ops_cuda.h" /* NN_GEMM_TUNE_MAX */

/* A layer's activations, all f32, rows of the N = B T positions. */
typedef struct layer_acts {
    float *ln1, *rstd1;   /* (N,C), (N): input_layernorm's output and 1/rms */
    float *q;             /* (N,NH hd) = (B,T,NH,hd), after RoPE */
    float *k, *v;         /* (N,NKV hd) = (B,T,NKV,hd), k after RoPE */
    float *att, *lse;     /* (N,NH hd): attention output, before o_proj; (B,NH,T) */
    float *res2;          /* (N,C): x + the attention branch */
    float *ln2, *rstd2;   /* (N,C), (N): post_attention_layernorm */
    float *gate, *up, *h; /* (N,F): h = silu(gate) up, down_proj's input */
} layer_acts_t;

struct llama_model {
    bmt_ctx_t *ctx;
    llama_config_t cfg;
    int B, T, N;        /* N = B T rows */
    int Q, KV;          /* NH hd and NKV hd: widths of q and of k, v */
    bool ckpt;          /* the list checkpoints activations */
    int keep_from;      /* layers l >= keep_from keep their activations (set l); the others
                         * are recomputed in set L, the scratch: 0 without checkpointing,
                         * L with it, less after llama_model_keep_layers */
    nn_fp8_plan_t *fp8; /* llama_model_fp8: the layers' products emulated in FP8 (cpu), or NULL */
    int fp8_history;    /* its history (0: current scaling) */
    bmt_dtype_t pdtype; /* parameters: f32 on cpu, bf16 on cuda */
    llama_cu_t *cu;     /* the CUDA half (model_cuda.c), NULL on cpu */
    bmt_blocklist_t *list;
    int32_t *inputs, *targets; /* (B,T) of the current micro-batch */
    int counted;               /* targets >= 0 */
    float *inv_freq;           /* (hd/2): RoPE's frequencies, scaled as the config says */
    float **x;                 /* (L+1) x (N,C): the residual stream, the layers' inputs */
    layer_acts_t *acts;        /* L + 1 sets, those in use allocated (keep_from) */
    /* final norm and head */
    float *xf, *rstdf; /* (N,C), (N): model.norm's output (the head's input), 1/rms */
    float *logits;     /* (N,V) */
    double *row_lse;   /* (N): log-sum-exp of each row of logits */
    float loss;        /* mean over counted rows */
    /* backward scratch */
    float *dres, *dres2, *dln, *dxf; /* (N,C) */
    float *datt, *dq, *dq_pre;       /* (N,Q): d att, d q after and before RoPE */
    float *dk, *dk_pre, *dv;         /* (N,KV) */
    float *dh, *dgate, *dup;         /* (N,F) */
    float *dlogits;                  /* (N,V) */
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

/* A layer block's parameters are indexed by model_cuda.h's P_* (the order
 * build_blocks adds them in). */

static layer_acts_t *acts_of(llama_model_t *m, int l)
{
    return &m->acts[l >= m->keep_from ? l : m->cfg.n_layer];
}

/* A layer's products, out (N,OC) = inp (N,IC) W^T with W nn.Linear's
 * (OC,IC): f32, or (llama_model_fp8) with their operands through FP8 as the
 * cuda model computes them. q, k and v are one product there, and gate and up
 * another (model_cuda.c stacks their weights), so under FP8 each stack has
 * one scale per operand, as Transformer Engine's fused QKV linear has: the
 * four products k (PRODUCT) of layer l are plan entry 4 l + k. A stack is
 * emulated as one product over the stacked weight (copies: the cpu model
 * keeps q, k, v and gate, up apart); in f32 each part is its own product, as
 * before. An operand FP8 cannot scale gives NaN results, so the step is
 * skipped as any non-finite one. -1 only for memory. */
static const char *const PRODUCT[4] = { "q_proj|k_proj|v_proj", "o_proj", "gate_proj|up_proj",
                                        "down_proj" };
enum {
    K_QKV,
    K_O,
    K_GU,
    K_DOWN
};

/* One part of a stack: its output (forward) or output gradient (backward),
 * weight (width, IC), weight gradient (backward), width. */
typedef struct part {
    float *out;
    const float *w;
    float *dw;
    int width;
} part_t;

static nn_fp8_scaling_t *scaling(llama_model_t *m, int l, int k)
{
    return m->fp8 ? nn_fp8_plan_at(m->fp8, 4 * l + k) : NULL;
}

static int fp8_oom(int l, int k, const char *what, bmt_error_t *err)
{
    return fail(err, "llama: layer %d %s%s: FP8: out of memory for its operands' copies", l,
                PRODUCT[k], what);
}

/* The stack's weights one after another, (OC, IC); NULL when out of memory. */
static float *stack_weights(const part_t *pt, int n, int IC, int OC)
{
    float *w = malloc((size_t)OC * IC * sizeof(float));
    for (int i = 0, r = 0; w && i < n; r += pt[i++].width)
        memcpy(w + (size_t)r * IC, pt[i].w, (size_t)pt[i].width * IC * sizeof(float));
    return w;
}

/* Rows of (N, OC) to or from the parts' (N, width) buffers. */
static void stack_rows(float *all, const part_t *pt, int n, int N, int OC, bool gather)
{
    for (int i = 0, c = 0; i < n; c += pt[i++].width)
        for (size_t r = 0; r < (size_t)N; r++) {
            float *s = all + r * OC + c, *d = pt[i].out + r * pt[i].width;
            memcpy(gather ? s : d, gather ? d : s, (size_t)pt[i].width * sizeof(float));
        }
}

static int linear_fwd(llama_model_t *m, int l, int k, const part_t *pt, int n, const float *inp,
                      int IC, bmt_error_t *err)
{
    nn_fp8_scaling_t *sc = scaling(m, l, k);
    if (sc == NULL || n == 1) {
        for (int i = 0; i < n; i++)
            if (nn_linear_forward(sc, pt[i].out, inp, pt[i].w, NULL, m->N, IC, pt[i].width, 1) < 0)
                return fp8_oom(l, k, "", err);
        return 0;
    }
    int OC = 0;
    for (int i = 0; i < n; i++)
        OC += pt[i].width;
    float *w = stack_weights(pt, n, IC, OC), *out = malloc((size_t)m->N * OC * sizeof(float));
    const int rc = w && out ? nn_linear_forward(sc, out, inp, w, NULL, m->N, IC, OC, 1) : -1;
    if (rc >= 0)
        stack_rows(out, pt, n, m->N, OC, false);
    free(w);
    free(out);
    return rc < 0 ? fp8_oom(l, k, "", err) : 0;
}

/* dinp (N,IC) and each part's dw (width,IC) += from its dout (pt.out), as
 * nn_matmul_backward. */
static int linear_bwd(llama_model_t *m, int l, int k, float *dinp, const part_t *pt, int n,
                      const float *inp, int IC, bmt_error_t *err)
{
    nn_fp8_scaling_t *sc = scaling(m, l, k);
    if (sc == NULL || n == 1) {
        for (int i = 0; i < n; i++)
            if (nn_linear_backward(sc, dinp, pt[i].dw, NULL, pt[i].out, inp, pt[i].w, m->N, IC,
                                   pt[i].width, 1) < 0)
                return fp8_oom(l, k, " backward", err);
        return 0;
    }
    int OC = 0;
    for (int i = 0; i < n; i++)
        OC += pt[i].width;
    float *w = stack_weights(pt, n, IC, OC), *dout = malloc((size_t)m->N * OC * sizeof(float)),
          *dw = calloc((size_t)OC * IC, sizeof(float));
    int rc = -1;
    if (w && dout && dw) {
        stack_rows(dout, pt, n, m->N, OC, true);
        rc = nn_linear_backward(sc, dinp, dw, NULL, dout, inp, w, m->N, IC, OC, 1);
        for (int i = 0, r = 0; rc >= 0 && i < n; r += pt[i++].width)
            for (size_t j = 0; j < (size_t)pt[i].width * IC; j++)
                pt[i].dw[j] += dw[(size_t)r * IC + j];
    }
    free(w);
    free(dout);
    free(dw);
    return rc < 0 ? fp8_oom(l, k, " backward", err) : 0;
}

static int layer_forward(llama_model_t *m, int l, const float *const *p, bmt_error_t *err)
{
    const int B = m->B, T = m->T, N = m->N, C = m->cfg.n_embd, F = m->cfg.ffn;
    const int NH = m->cfg.n_head, NKV = m->cfg.n_kv_head, hd = m->cfg.head_dim;
    layer_acts_t *a = acts_of(m, l);
    const float *x = m->x[l];
    float *out = m->x[l + 1];
    nn_rmsnorm_forward(a->ln1, a->rstd1, x, p[P_IN_NORM], N, C, (float)m->cfg.rms_eps);
    const part_t qkv[3] = { { a->q, p[P_Q], NULL, m->Q },
                            { a->k, p[P_K], NULL, m->KV },
                            { a->v, p[P_V], NULL, m->KV } };
    if (linear_fwd(m, l, K_QKV, qkv, 3, a->ln1, C, err) < 0)
        return -1;
    nn_rope_forward(a->q, a->q, m->inv_freq, B, T, NH, hd);
    nn_rope_forward(a->k, a->k, m->inv_freq, B, T, NKV, hd);
    nn_attention_forward(a->att, a->lse, a->q, a->k, a->v, B, T, NH, NKV, hd);
    if (linear_fwd(m, l, K_O, &(part_t){ out, p[P_O], NULL, C }, 1, a->att, m->Q, err) <
        0) /* out as a temporary */
        return -1;
    for (size_t i = 0; i < (size_t)N * C; i++)
        a->res2[i] = x[i] + out[i];
    nn_rmsnorm_forward(a->ln2, a->rstd2, a->res2, p[P_POST_NORM], N, C, (float)m->cfg.rms_eps);
    const part_t gu[2] = { { a->gate, p[P_GATE], NULL, F }, { a->up, p[P_UP], NULL, F } };
    if (linear_fwd(m, l, K_GU, gu, 2, a->ln2, C, err) < 0)
        return -1;
    nn_swiglu_forward(a->h, a->gate, a->up, N * F);
    if (linear_fwd(m, l, K_DOWN, &(part_t){ out, p[P_DOWN], NULL, C }, 1, a->h, F, err) < 0)
        return -1;
    for (size_t i = 0; i < (size_t)N * C; i++)
        out[i] += a->res2[i];
    return 0;
}

/* dres: in, the gradient w.r.t. x[l+1]; out, w.r.t. x[l]. The nn backward
 * functions add, so every scratch gradient is zeroed before its first use. */
static int layer_backward(llama_model_t *m, int l, const float *const *p, float *const *g,
                          bmt_error_t *err)
{
    const int B = m->B, T = m->T, N = m->N, C = m->cfg.n_embd, F = m->cfg.ffn;
    const int NH = m->cfg.n_head, NKV = m->cfg.n_kv_head, hd = m->cfg.head_dim;
    layer_acts_t *a = acts_of(m, l);
    const size_t nc = (size_t)N * C * sizeof(float), nf = (size_t)N * F * sizeof(float);
    const size_t nq = (size_t)N * m->Q * sizeof(float), nkv = (size_t)N * m->KV * sizeof(float);

    /* The MLP branch: out = res2 + down(silu(gate(ln2)) up(ln2)). */
    memcpy(m->dres2, m->dres, nc); /* the residual path: d res2 = d out + ... */
    memset(m->dh, 0, nf);
    if (linear_bwd(m, l, K_DOWN, m->dh, &(part_t){ m->dres, p[P_DOWN], g[P_DOWN], C }, 1, a->h, F,
                   err) < 0)
        return -1;
    memset(m->dgate, 0, nf);
    memset(m->dup, 0, nf);
    nn_swiglu_backward(m->dgate, m->dup, m->dh, a->gate, a->up, N * F);
    memset(m->dln, 0, nc);
    const part_t gu[2] = { { m->dgate, p[P_GATE], g[P_GATE], F }, { m->dup, p[P_UP], g[P_UP], F } };
    if (linear_bwd(m, l, K_GU, m->dln, gu, 2, a->ln2, C, err) < 0)
        return -1;
    nn_rmsnorm_backward(m->dres2, g[P_POST_NORM], m->dln, a->res2, p[P_POST_NORM], a->rstd2, N, C);

    /* The attention branch: res2 = x + o(attn(rope(q(ln1)), rope(k(ln1)), v(ln1))). */
    memcpy(m->dres, m->dres2, nc); /* d x = d res2 + ... */
    memset(m->datt, 0, nq);
    if (linear_bwd(m, l, K_O, m->datt, &(part_t){ m->dres2, p[P_O], g[P_O], C }, 1, a->att, m->Q,
                   err) < 0)
        return -1;
    memset(m->dq, 0, nq);
    memset(m->dk, 0, nkv);
    memset(m->dv, 0, nkv);
    nn_attention_backward(m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k, a->v, B, T, NH,
                          NKV, hd);
    memset(m->dq_pre, 0, nq); /* RoPE's backward adds, so not in place */
    memset(m->dk_pre, 0, nkv);
    nn_rope_backward(m->dq_pre, m->dq, m->inv_freq, B, T, NH, hd);
    nn_rope_backward(m->dk_pre, m->dk, m->inv_freq, B, T, NKV, hd);
    memset(m->dln, 0, nc);
    const part_t qkv[3] = { { m->dq_pre, p[P_Q], g[P_Q], m->Q },
                            { m->dk_pre, p[P_K], g[P_K], m->KV },
                            { m->dv, p[P_V], g[P_V], m->KV } };
    if (linear_bwd(m, l, K_QKV, m->dln, qkv, 3, a->ln1, C, err) < 0)
        return -1;
    nn_rmsnorm_backward(m->dres, g[P_IN_NORM], m->dln, m->x[l], p[P_IN_NORM], a->rstd1, N, C);
    return 0;
}

/* Use 0, "model.embed_tokens": x_0 = weight[inputs]. */
static int embed_fwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    llama_model_t *m = mp;
    const float *w = c->params[0]; /* (V,C) */
    const size_t C = (size_t)m->cfg.n_embd;
    if (m->fp8 && !c->recompute)
        nn_fp8_plan_begin(m->fp8); /* a pass begins (nn_fp8_plan_t) */
    for (int i = 0; i < m->N; i++)
        memcpy(m->x[0] + i * C, w + (size_t)m->inputs[i] * C, C * sizeof(float));
    return 0;
}

static int embed_bwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    llama_model_t *m = mp;
    float *dw = c->grads[0]; /* (V,C) */
    const size_t C = (size_t)m->cfg.n_embd;
    for (int i = 0; i < m->N; i++) {
        float *row = dw + (size_t)m->inputs[i] * C;
        const float *d = m->dres + i * C;
        for (size_t j = 0; j < C; j++)
            row[j] += d[j];
    }
    if (m->fp8)
        nn_fp8_plan_end(m->fp8);
    return 0;
}

/* Uses 1..L, "model.layers.<l>". */
static int layer_fwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    return layer_forward(mp, c->index - 1, (const float *const *)c->params, err);
}

static int layer_bwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    return layer_backward(mp, c->index - 1, (const float *const *)c->params,
                          (float *const *)c->grads, err);
}

/* Use L+1, "model.norm": xf = rms(x_L) weight. */
static int norm_fwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    llama_model_t *m = mp;
    nn_rmsnorm_forward(m->xf, m->rstdf, m->x[m->cfg.n_layer], c->params[0], m->N, m->cfg.n_embd,
                       (float)m->cfg.rms_eps);
    return 0;
}

static int norm_bwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    llama_model_t *m = mp;
    memset(m->dres, 0, (size_t)m->N * m->cfg.n_embd * sizeof(float));
    nn_rmsnorm_backward(m->dres, c->grads[0], m->dxf, m->x[m->cfg.n_layer], c->params[0], m->rstdf,
                        m->N, m->cfg.n_embd);
    return 0;
}

/* Use L+2, "lm_head" (or the tied embedding): logits = xf weight^T and the
 * mean cross-entropy over the counted rows, its log-sum-exp in double. */
static int head_fwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    llama_model_t *m = mp;
    const int N = m->N, V = m->cfg.vocab_size;
    nn_matmul_forward(m->logits, m->xf, c->params[0], N, m->cfg.n_embd, V);
    double sum = 0;
    for (int i = 0; i < N; i++) {
        const float *z = m->logits + (size_t)i * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < V; j++)
            s += exp(z[j] - mx);
        m->row_lse[i] = mx + log(s);
        if (m->targets[i] >= 0)
            sum += m->row_lse[i] - z[m->targets[i]];
    }
    m->loss = m->counted ? (float)(sum / m->counted) : 0.0f;
    return 0;
}

static int head_bwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)err;
    llama_model_t *m = mp;
    const int N = m->N, V = m->cfg.vocab_size, C = m->cfg.n_embd;
    /* d loss / d logit = (softmax - onehot(target)) / counted on counted rows */
    for (int i = 0; i < N; i++) {
        const float *z = m->logits + (size_t)i * V;
        float *dz = m->dlogits + (size_t)i * V;
        const int t = m->targets[i];
        if (t < 0) {
            memset(dz, 0, (size_t)V * sizeof(float));
            continue;
        }
        const double scale = 1.0 / m->counted;
        for (int j = 0; j < V; j++)
            dz[j] = (float)((exp(z[j] - m->row_lse[i]) - (j == t)) * scale);
    }
    memset(m->dxf, 0, (size_t)N * C * sizeof(float));
    nn_matmul_backward(m->dxf, c->grads[0], m->dlogits, m->xf, c->params[0], N, C, V);
    return 0;
}

/* The callbacks of each kind of block: the CPU's here, or on a cuda context
 * model_cuda.c's (which tells the uses apart by call->index). */
typedef struct model_ops {
    bmt_block_ops_t embed, layer, norm, head;
} model_ops_t;

static const model_ops_t CPU_OPS = {
    { embed_fwd_cb, embed_bwd_cb },
    { layer_fwd_cb, layer_bwd_cb },
    { norm_fwd_cb, norm_bwd_cb },
    { head_fwd_cb, head_bwd_cb },
};

static int cu_fwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    return llama_cu_forward(((llama_model_t *)mp)->cu, c, err);
}

static int cu_bwd_cb(void *mp, const bmt_block_call_t *c, bmt_error_t *err)
{
    return llama_cu_backward(((llama_model_t *)mp)->cu, c, err);
}

static const model_ops_t CUDA_OPS = {
    { cu_fwd_cb, cu_bwd_cb },
    { cu_fwd_cb, cu_bwd_cb },
    { cu_fwd_cb, cu_bwd_cb },
    { cu_fwd_cb, cu_bwd_cb },
};

/* ------------------------------------------------------------ construction */

/* A block of parameters (name, shape, init, flags), built from seed; NULL and
 * err on failure (nothing left behind). */
typedef struct param_spec {
    const char *name;
    int ndim;
    int64_t d0, d1;
    bmt_init_t init;
    unsigned flags;
} param_spec_t;

static bmt_block_t *make_block(llama_model_t *m, const char *name, const param_spec_t *ps, int n,
                               uint64_t seed, bmt_error_t *err)
{
    bmt_block_t *b = bmt_block_create(m->ctx, name, err);
    if (b == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
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

/* Append a block made from ps to the list (which then owns it). */
static bmt_block_t *append_block(llama_model_t *m, const char *name, const param_spec_t *ps, int n,
                                 const bmt_block_ops_t *ops, uint64_t seed, bmt_error_t *err)
{
    bmt_block_t *b = make_block(m, name, ps, n, seed, err);
    if (b && bmt_blocklist_append(m->list, b, ops, m, err) < 0) {
        bmt_block_destroy(b);
        return NULL;
    }
    return b;
}

static int build_blocks(llama_model_t *m, uint64_t seed, bmt_error_t *err)
{
    const int64_t C = m->cfg.n_embd, V = m->cfg.vocab_size;
    const bmt_init_t w = BMT_INIT_NORMAL_V(0, 0.02), one = BMT_INIT_ONES_V;
    const unsigned nd = BMT_PARAM_NO_DECAY;
    const param_spec_t emb[] = { { "weight", 2, V, C, w, 0 } };
    const param_spec_t norm[] = { { "weight", 1, C, 0, one, nd } };
    /* llama_layer_tensors' names and shapes; the norms (one dimension) start
     * at 1 without decay, the products' weights N(0, 0.02) */
    _Static_assert(P_LAYER_COUNT == LLAMA_LAYER_TENSORS && P_Q == 1 && P_POST_NORM == 5 &&
                       P_DOWN == 8,
                   "P_* follow llama_layer_tensors' order");
    llama_tensor_spec_t t[LLAMA_LAYER_TENSORS];
    llama_layer_tensors(&m->cfg, t);
    param_spec_t layer[P_LAYER_COUNT];
    for (int j = 0; j < P_LAYER_COUNT; j++)
        layer[j] = t[j].d1 ? (param_spec_t){ t[j].name, 2, t[j].d0, t[j].d1, w, 0 }
                           : (param_spec_t){ t[j].name, 1, t[j].d0, 0, one, nd };
    const model_ops_t *ops = m->cu ? &CUDA_OPS : &CPU_OPS;
    bmt_block_t *embed = append_block(m, "model.embed_tokens", emb, 1, &ops->embed, seed, err);
    if (embed == NULL)
        return -1;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        char name[64];
        snprintf(name, sizeof(name), "model.layers.%d", l);
        if (append_block(m, name, layer, P_LAYER_COUNT, &ops->layer, seed, err) == NULL)
            return -1;
    }
    if (append_block(m, "model.norm", norm, 1, &ops->norm, seed, err) == NULL)
        return -1;
    if (m->cfg.tied)
        return bmt_blocklist_append_tied(m->list, embed, &ops->head, m, err);
    return append_block(m, "lm_head", emb, 1, &ops->head, seed, err) ? 0 : -1;
}

/* What each_act does with one buffer: allocate it (alloc_one), free it
 * (free_one) or count its floats (count_one). *p is where the buffer's
 * pointer lives, n its floats. */
typedef struct act_visit {
    void (*fn)(struct act_visit *v, float **p, size_t n);
    llama_model_t *m;
    bmt_error_t *err;
    int rc;       /* alloc_one: -1 after the first failure (the rest are left NULL) */
    size_t count; /* count_one: floats so far */
} act_visit_t;

/* Whether set i is in use when layers keep_from.. keep theirs: a kept
 * layer's (i < L), or the scratch (i == L) when some layer is recomputed. */
static bool set_used(const llama_model_t *m, int keep_from, int i)
{
    return i < m->cfg.n_layer ? i >= keep_from : keep_from > 0;
}

/* Set i's buffers with their sizes. */
static void each_set_buf(llama_model_t *m, int i, act_visit_t *v)
{
    const size_t N = (size_t)m->N, C = (size_t)m->cfg.n_embd;
    const size_t F = (size_t)m->cfg.ffn, Q = (size_t)m->Q, KV = (size_t)m->KV;
    const size_t lse = (size_t)m->B * m->cfg.n_head * m->T;
    layer_acts_t *a = &m->acts[i];
    float **bufs[] = { &a->ln1,  &a->rstd1, &a->q,     &a->k,    &a->v,  &a->att, &a->lse,
                       &a->res2, &a->ln2,   &a->rstd2, &a->gate, &a->up, &a->h };
    const size_t n[] = { N * C, N,     N * Q, N * KV, N * KV, N * Q, lse,
                         N * C, N * C, N,     N * F,  N * F,  N * F };
    _Static_assert(sizeof(bufs) / sizeof(bufs[0]) == sizeof(n) / sizeof(n[0]),
                   "a size for every buffer");
    for (size_t j = 0; j < sizeof(n) / sizeof(n[0]); j++)
        v->fn(v, bufs[j], n[j]);
}

/* Every activation buffer with its size, in one place, so that allocation and
 * freeing cannot disagree. Needs m->x and m->acts. */
static void each_act(llama_model_t *m, act_visit_t *v)
{
    const size_t N = (size_t)m->N, C = (size_t)m->cfg.n_embd, V = (size_t)m->cfg.vocab_size;
    const size_t F = (size_t)m->cfg.ffn, Q = (size_t)m->Q, KV = (size_t)m->KV;
    const int L = m->cfg.n_layer;
    for (int l = 0; l <= L; l++)
        v->fn(v, &m->x[l], N * C);
    for (int i = 0; i <= L; i++)
        if (set_used(m, m->keep_from, i))
            each_set_buf(m, i, v);
    float **bufs[] = { &m->xf,    &m->dres,   &m->dres2, &m->dln,    &m->dxf,     &m->datt,
                       &m->dq,    &m->dq_pre, &m->dk,    &m->dk_pre, &m->dv,      &m->dh,
                       &m->dgate, &m->dup,    &m->rstdf, &m->logits, &m->dlogits, &m->inv_freq };
    const size_t n[] = { N * C, N * C, N * C,  N * C,  N * C,  N * Q,
                         N * Q, N * Q, N * KV, N * KV, N * KV, N * F,
                         N * F, N * F, N,      N * V,  N * V,  (size_t)m->cfg.head_dim / 2 };
    _Static_assert(sizeof(bufs) / sizeof(bufs[0]) == sizeof(n) / sizeof(n[0]),
                   "a size for every buffer");
    for (size_t j = 0; j < sizeof(n) / sizeof(n[0]); j++)
        v->fn(v, bufs[j], n[j]);
}

static void alloc_one(act_visit_t *v, float **p, size_t n)
{
    if (v->rc == 0 &&
        (*p = bmt_alloc(v->m->ctx, BMT_MEM_ACTIVATION, n * sizeof(float), v->err)) == NULL)
        v->rc = -1;
}

static void count_one(act_visit_t *v, float **p, size_t n)
{
    (void)p;
    v->count += n;
}

static void free_one(act_visit_t *v, float **p, size_t n)
{
    (void)n;
    bmt_free(v->m->ctx, *p);
    *p = NULL;
}

static int alloc_acts(llama_model_t *m, bmt_error_t *err)
{
    const int L = m->cfg.n_layer;
    m->x = calloc((size_t)L + 1, sizeof(float *));
    m->acts = calloc((size_t)L + 1, sizeof(layer_acts_t));
    if (!m->x || !m->acts)
        return fail(err, "model: rank %d: out of memory for the model's activations",
                    bmt_rank(m->ctx));
    act_visit_t v = { .fn = alloc_one, .m = m, .err = err };
    each_act(m, &v);
    if (v.rc == 0 && (m->row_lse = bmt_alloc(m->ctx, BMT_MEM_ACTIVATION,
                                             (size_t)m->N * sizeof(double), err)) == NULL)
        v.rc = -1;
    return v.rc;
}

static void free_acts(llama_model_t *m)
{
    if (m->x && m->acts) {
        act_visit_t v = { .fn = free_one, .m = m };
        each_act(m, &v);
    }
    bmt_free(m->ctx, m->row_lse);
}

llama_model_t *llama_model_create(bmt_ctx_t *ctx, const llama_config_t *cfg, int B, int T,
                                  const bmt_blocklist_config_t *list_cfg, uint64_t seed,
                                  bmt_error_t *err)
{
    if (llama_config_check(cfg, err) < 0)
        return NULL;
    if (B < 1 || T < 1 || T > cfg->max_seq_len || (int64_t)B * T > (1 << 24)) {
        fail(err,
             "model: micro-batch %d x sequence length %d: need B >= 1, 1 <= T <= %d "
             "(max_position_embeddings) and B T <= 2^24",
             B, T, cfg->max_seq_len);
        return NULL;
    }
    const bool cuda = bmt_device(ctx) == BMT_DEVICE_CUDA;
    if (!cuda && (int64_t)B * T * cfg->vocab_size > ((int64_t)1 << 40) / 4) {
        fail(err, "model: B T V = %lld logits is too many for the cpu model",
             (long long)B * T * cfg->vocab_size);
        return NULL;
    }
    llama_model_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        fail(err, "model: out of memory");
        return NULL;
    }
    m->ctx = ctx;
    m->cfg = *cfg;
    m->pdtype = cuda ? BMT_BF16 : BMT_F32;
    m->B = B, m->T = T, m->N = B * T;
    m->Q = cfg->n_head * cfg->head_dim;
    m->KV = cfg->n_kv_head * cfg->head_dim;
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    if (list_cfg)
        lc = *list_cfg;
    m->ckpt = lc.checkpointing != 0;
    m->keep_from = m->ckpt ? cfg->n_layer : 0;
    const nn_rope_scaling_t s = { cfg->rope_factor, cfg->rope_low_freq_factor,
                                  cfg->rope_high_freq_factor, cfg->rope_original_max };
    m->inputs = calloc((size_t)m->N, sizeof(int32_t));
    m->targets = calloc((size_t)m->N, sizeof(int32_t));
    float *freqs = calloc((size_t)cfg->head_dim / 2, sizeof(float)); /* cuda: uploaded */
    if (!m->inputs || !m->targets || !freqs) {
        free(freqs);
        fail(err, "model: out of memory");
        goto fail;
    }
    /* On cuda, the CUDA half first: it refuses sizes it cannot compute before
     * any block is built. */
    nn_rope_freqs(freqs, cfg->head_dim, cfg->rope_theta, cfg->rope_llama3 ? &s : NULL);
    m->cu = cuda ? llama_cu_create(ctx, cfg, B, T, m->ckpt, freqs, err) : NULL;
    free(freqs);
    if (cuda && m->cu == NULL)
        goto fail;
    if ((m->list = bmt_blocklist_create(ctx, &lc, err)) == NULL || build_blocks(m, seed, err) < 0 ||
        (!cuda && alloc_acts(m, err) < 0))
        goto fail;
    /* The CUDA callbacks write fresh gradients (products with beta 0): the
     * list need not zero them first. */
    if (cuda && bmt_blocklist_set_grad_overwrite(m->list, true, err) < 0)
        goto fail;
    if (!cuda)
        nn_rope_freqs(m->inv_freq, cfg->head_dim, cfg->rope_theta, cfg->rope_llama3 ? &s : NULL);
    return m;
fail:
    llama_model_destroy(m);
    return NULL;
}

bmt_blocklist_t *llama_model_list(llama_model_t *m) { return m ? m->list : NULL; }

const llama_config_t *llama_model_config(const llama_model_t *m) { return &m->cfg; }

int llama_model_set_batch(llama_model_t *m, const int32_t *inputs, const int32_t *targets,
                          bmt_error_t *err)
{
    const int V = m->cfg.vocab_size;
    int counted = 0;
    for (int i = 0; i < m->N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return fail(err,
                        "model: input token %d at position %d (row %d, column %d) is outside "
                        "the vocabulary [0, %d)",
                        inputs[i], i, i / m->T, i % m->T, V);
        if (targets[i] >= V)
            return fail(err,
                        "model: target token %d at position %d (row %d, column %d) is outside "
                        "the vocabulary [0, %d)",
                        targets[i], i, i / m->T, i % m->T, V);
        counted += targets[i] >= 0;
    }
    if (m->cu && llama_cu_set_batch(m->cu, inputs, targets, counted, err) < 0)
        return -1;
    memcpy(m->inputs, inputs, (size_t)m->N * sizeof(int32_t));
    memcpy(m->targets, targets, (size_t)m->N * sizeof(int32_t));
    m->counted = counted;
    return 0;
}

float llama_model_loss(const llama_model_t *m)
{
    if (m->cu) {
        bmt_error_t err;
        float loss;
        if (llama_cu_loss(m->cu, &loss, &err) < 0) {
            fprintf(stderr, "llama: rank %d: %s\n", bmt_rank(m->ctx), err.text);
            return NAN;
        }
        return loss;
    }
    return m->loss;
}

int llama_model_keep_logits(llama_model_t *m, bmt_error_t *err)
{
    return m->cu ? llama_cu_keep_logits(m->cu, err) : 0;
}

const float *llama_model_logits(const llama_model_t *m)
{
    if (m->cu) {
        bmt_error_t err;
        const float *l = llama_cu_logits(m->cu, &err);
        if (l == NULL)
            fprintf(stderr, "llama: rank %d: %s\n", bmt_rank(m->ctx), err.text);
        return l;
    }
    return m->logits;
}

bmt_dtype_t llama_model_param_dtype(const llama_model_t *m) { return m->pdtype; }

int llama_model_fp8(llama_model_t *m, int on, int history, bmt_error_t *err)
{
    if (history < 0 || history > NN_FP8_HISTORY_MAX)
        return fail(err, "llama: an FP8 history of %d passes: give 0 (current scaling) to %d",
                    history, NN_FP8_HISTORY_MAX);
    if (m->cu)
        return llama_cu_fp8(m->cu, on, history, err);
    if (m->fp8 && (!on || history != m->fp8_history))
        return fail(err, "llama: FP8 and its scaling cannot change once on");
    if (!on || m->fp8)
        return 0;
    if ((m->fp8 = nn_fp8_plan_create(m->cfg.n_layer * 4, history)) == NULL)
        return fail(err, "llama: FP8: out of memory for the scales");
    m->fp8_history = history;
    return 0;
}

int llama_model_gemm_tune(llama_model_t *m, int candidates, bmt_error_t *err)
{
    if (candidates < 0 || candidates > NN_GEMM_TUNE_MAX)
        return fail(err, "llama: %d product candidates to time: give 0 (no timing) to %d",
                    candidates, NN_GEMM_TUNE_MAX);
    return m->cu ? llama_cu_gemm_tune(m->cu, candidates, err) : 0;
}

int llama_model_fp8_stats(llama_model_t *m, nn_fp8_stats_t *st, bmt_error_t *err)
{
    if (m->cu)
        return llama_cu_fp8_stats(m->cu, st, err);
    if (m->fp8)
        nn_fp8_plan_begin(m->fp8); /* closes the last pass, as a forward would */
    *st = m->fp8 ? nn_fp8_plan_stats(m->fp8) : (nn_fp8_stats_t){ 0, 0, 0 };
    return 0;
}

int llama_model_act_bytes(const llama_model_t *m, int64_t *layer, int64_t *head)
{
    if (m->cu) {
        llama_cu_act_bytes(m->cu, layer, head);
    } else { /* a set's floats; the cpu head keeps its logits whole always */
        act_visit_t v = { .fn = count_one, .m = (llama_model_t *)m };
        each_set_buf(v.m, m->cfg.n_layer, &v);
        *layer = (int64_t)(v.count * sizeof(float)), *head = 0;
    }
    return m->cfg.n_layer;
}

int llama_model_keep_attention(llama_model_t *m, int mode, bmt_error_t *err)
{
    if (mode > 0 && m->cu == NULL)
        return fail(err, "model: keeping the attention outputs through checkpointing is for the "
                         "cuda model (--device cuda); the cpu model recomputes its layers whole");
    return m->cu ? llama_cu_keep_attention(m->cu, mode, err) : 0;
}

int llama_model_keep_layers(llama_model_t *m, int layers, bool head, bmt_error_t *err)
{
    const int L = m->cfg.n_layer;
    if (!m->ckpt)
        return fail(err, "model: keeping layers' activations is selective checkpointing: the "
                         "model was made without checkpointing (every layer keeps them already)");
    if (layers < 0 || layers > L)
        return fail(err, "model: %d layers cannot keep their activations: the model has %d", layers,
                    L);
    /* Refused after the first forward before anything changes (setting use
     * 1 to what it is), then this model's sets (cpu: the new ones first, so
     * that running out of memory leaves everything as it was), then the list:
     * layer l is use l + 1, the head the last use. */
    const int n = bmt_blocklist_size(m->list);
    if (bmt_blocklist_set_checkpointing(m->list, 1, bmt_blocklist_checkpointing(m->list, 1), err) <
        0)
        return -1;
    if (m->cu) {
        if (llama_cu_keep_layers(m->cu, L - layers, head, err) < 0)
            return -1;
    } else {
        const int was = m->keep_from, now = L - layers;
        act_visit_t fv = { .fn = free_one, .m = m }, av = { .fn = alloc_one, .m = m, .err = err };
        for (int i = 0; i <= L; i++)
            if (!set_used(m, was, i) && set_used(m, now, i))
                each_set_buf(m, i, &av);
        if (av.rc < 0) { /* give back what came, keep what was */
            for (int i = 0; i <= L; i++)
                if (!set_used(m, was, i) && set_used(m, now, i))
                    each_set_buf(m, i, &fv);
            return -1;
        }
        for (int i = 0; i <= L; i++)
            if (set_used(m, was, i) && !set_used(m, now, i))
                each_set_buf(m, i, &fv);
        m->keep_from = now;
    }
    for (int l = 0; l < L; l++)
        if (bmt_blocklist_set_checkpointing(m->list, l + 1, l < L - layers, err) < 0)
            return -1;
    return bmt_blocklist_set_checkpointing(m->list, n - 1, !head, err);
}

void llama_model_destroy(llama_model_t *m)
{
    if (m == NULL)
        return;
    bmt_blocklist_destroy(m->list);
    llama_cu_destroy(m->cu);
    nn_fp8_plan_destroy(m->fp8);
    free_acts(m);
    free(m->x);
    free(m->acts);
    free(m->inputs);
    free(m->targets);
    free(m);
}

/* ------------------------------------------------------------ safetensors */

typedef struct load_src {
    bmt_st_t *st;
    const int *idx; /* (params of the block) tensor index of each */
} load_src_t;

static int read_param(void *user, const bmt_block_t *b, int param, int64_t first, int64_t count,
                      void *dst, bmt_dtype_t dtype, bmt_error_t *err)
{
    (void)b;
    const load_src_t *s = user;
    return bmt_st_read(s->st, s->idx[param], first, count, dst, dtype, err);
}

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape)
{
    out[0] = '\0';
    for (int d = 0; d < ndim; d++)
        snprintf(out + strlen(out), len - strlen(out), "%s%lld", d ? ", " : "",
                 (long long)shape[d]);
}

/* The tensor index of each parameter of block b in st, checked (name, shape,
 * a float dtype); -1 and err at the first that is missing or differs. */
static int match_block(const bmt_st_t *st, const char *path, const bmt_block_t *b, int *idx,
                       bmt_error_t *err)
{
    for (int j = 0; j < bmt_block_num_params(b); j++) {
        const char *name = bmt_block_param_name(b, j);
        const bmt_st_tensor_t *t = bmt_st_tensor(st, idx[j] = bmt_st_find(st, name));
        int ndim;
        int64_t shape[BMT_MAX_DIMS];
        bmt_block_param_shape(b, j, &ndim, shape);
        if (t == NULL)
            return fail(err, "%.200s has no tensor '%.200s'", path, name);
        bool same = t->ndim == ndim;
        for (int d = 0; same && d < ndim; d++)
            same = t->shape[d] == shape[d];
        if (!same) {
            char want[96], got[96];
            shape_text(want, sizeof(want), ndim, shape);
            shape_text(got, sizeof(got), t->ndim, t->shape);
            return fail(err, "%.150s: tensor '%.200s' is (%s); the model needs (%s)", t->file,
                        t->name, got, want);
        }
        if (t->dtype != BMT_ST_F32 && t->dtype != BMT_ST_BF16 && t->dtype != BMT_ST_F16 &&
            t->dtype != BMT_ST_F64)
            return fail(err, "%.150s: tensor '%.200s' is %s; a float type is needed", t->file,
                        t->name, bmt_st_dtype_name(t->dtype));
    }
    return 0;
}

int llama_model_load(llama_model_t *m, const char *path, bmt_error_t *err)
{
    bmt_st_t *st = bmt_st_open(path, err);
    if (st == NULL)
        return -1;
    /* The blocks to fill: every use but the tied head (the embedding again). */
    const int uses = bmt_blocklist_size(m->list) - (m->cfg.tied ? 1 : 0);
    int **idx = calloc((size_t)uses, sizeof(int *));
    int rc = idx ? 0 : fail(err, "model: out of memory");

    /* The file's layers must be the model's: more would be a model the
     * config does not describe, fewer a missing tensor named below. */
    bmt_st_plan_t *plan = NULL;
    if (rc == 0)
        rc = bmt_st_discover(st, &plan, err);
    if (rc == 0 && plan->nlayers != m->cfg.n_layer)
        rc = fail(err, "%.200s holds %d layers (%.60s<N>); the model has %d (num_hidden_layers)",
                  path, plan->nlayers, plan->layer_prefix, m->cfg.n_layer);
    bmt_st_plan_free(plan);

    /* Every name and shape first, so that a mismatch loads nothing. */
    for (int u = 0; u < uses && rc == 0; u++) {
        const bmt_block_t *b = bmt_blocklist_block(m->list, u);
        if ((idx[u] = calloc((size_t)bmt_block_num_params(b) + 1, sizeof(int))) == NULL)
            rc = fail(err, "model: out of memory");
        else
            rc = match_block(st, path, b, idx[u], err);
    }
    for (int u = 0; u < uses && rc == 0; u++) {
        load_src_t src = { st, idx[u] };
        rc = bmt_block_load(bmt_blocklist_block(m->list, u), read_param, &src, err);
    }
    for (int u = 0; idx && u < uses; u++)
        free(idx[u]);
    free(idx);
    bmt_st_close(st);
    return rc;
}
