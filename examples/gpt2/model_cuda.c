/* examples/gpt2/model_cuda.c — GPT-2's callbacks on CUDA (see model_cuda.h).
 *
 * The same dataflow as model.c's CPU layers, with nn/ops_cuda.h's kernels:
 * activations bf16, LayerNorm statistics and losses f32, parameter gradients
 * f32 (added into the list's buffers, or written where they are fresh:
 * bmt_block_call_t.grads_fresh). The residual stream x_0..x_L is kept
 * (the blocks' inputs); a layer's internals live in one scratch set under
 * activation checkpointing, else one set per layer.
 *
 * Activations are stream-ordered (bmt_alloc_async on the compute stream): each
 * buffer exists from its first writer to its last reader in a micro-batch. The
 * backward gives back x_l, the layer's saved set and its own gradients of
 * activations as it passes them (the MLP's weight gradient is taken before its
 * input gradient so that GELU's output is gone before dinp exists), so at a
 * layer's backward the activations are x_0..x_l and one layer's set, not all
 * the checkpoints next to every scratch buffer. With the runtime's gradient
 * shards made during the backward, that is what brings the peak of a group of
 * one under FSDP2's (docs/gpt2.md, Memory).
 *
 * The head overwrites its logits with their gradient (fused cross-entropy).
 * Without checkpointing the forward does that for all N rows and the backward
 * reads them from there. Under checkpointing the (N, V) logits are not kept:
 * the forward runs the head in chunks of head_rows rows for the loss alone,
 * and the backward recomputes each chunk's logits and gradient and takes its
 * products at once, so only one chunk's logits ever exist (1/4 or less of
 * them). The engine's recomputation of the head (it recomputes every block
 * under checkpointing) is then nothing to do, and neither is that of the
 * last layer when its activations are still the ones in the scratch set.
 *
 * keep_attn (gpt2_cu_keep_attention, under checkpointing with flash
 * attention): each layer's attention output and log-sum-exp live from its
 * forward to its backward, outside the scratch set, so the recomputation
 * skips the attention forward (LayerNorm and c_attn still run: the backward
 * needs qkv). N C bf16 and B H T f32 more per layer; the same bits.
 *
 * fp8 (gpt2_cu_fp8, docs/fp8.md): the four products of each layer take FP8
 * operands (nn_cuda_fp8_conv1d_*, delayed or current scaling: --fp8-scaling).
 * A product's input is then saved as its transposed E4M3 codes (all its
 * weight gradient reads) instead of bf16: LayerNorm's outputs are gone as soon
 * as their codes exist, and attention's output keeps its bf16 for the
 * attention's backward. GELU never runs as a kernel of its own: mlp.c_proj's
 * conversion computes GELU from c_fc's output as it makes the codes, and
 * c_fc's backward conversion GELU's gradient from mlp.c_proj's input
 * gradient and c_fc's output (with the bias gradient's column sums, as every
 * FP8 backward conversion takes them). The codes' scales live per
 * layer and product (fp8p), so a recomputation makes the same codes again;
 * the weights' are those of the layer's forward, which keeps their row-major
 * codes (a->wq, 12 C^2 bytes a layer) for the backward's input gradients
 * instead of converting the weights again (under checkpointing, but for
 * mlp.c_proj, which the recomputation does not reach). GELU inside cuBLASLt's FP8
 * products' epilogues (GELU_AUX_BIAS forward, DGELU backward) made the d48
 * step slower, 170.6 ms against 152.2 on an H200 (bench/NOTES.md, 2026-12-02
 * session 16); inside the conversion it pays about 1.9 ms (session 17).
 */
#include "gpt2/model_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/device.h"

#ifdef BMT_HAVE_CUDA
#include <cuda_runtime.h>

#include "nn/fp8_cuda.h"
#include "nn/ops_cuda.h"

typedef struct cu_layer {
    void *ln1, *qkvr, *att, *atty, *res2, *ln2, *fch, *fch_gelu; /* bf16 */
    void *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;             /* f32 */
    void *ln1_q, *atty_q, *ln2_q, *gelu_q; /* fp8: the products' inputs' transposed codes */
    /* fp8: the four weights' row-major codes (12 C^2 bytes; wq_at), forward to backward */
    void *wq;
} cu_layer_t;

struct gpt2_cu {
    bmt_ctx_t *ctx;
    gpt2_config_t cfg;
    int B, T, N, Vp; /* Vp: V rounded up to 64, the logits' row stride */
    int head_rows;   /* rows of logits that exist at once: N, or a chunk under checkpointing */
    int chunk_rows;  /* a chunk's rows under checkpointing (head_rows unless the head keeps all) */
    int acts_of;     /* the layer whose activations the scratch set holds, or -1 */
    int keep_from;   /* layers >= keep_from have their own set: 0, or L under checkpointing */
    bool ckpt;
    bool keep_attn;       /* checkpointing keeps each layer's attention output (katty, katt) */
    void **katty, **katt; /* (L) when keep_attn: a layer's atty and att, forward to backward */
    nn_cuda_t *h;
    void *workspace;
    int32_t *tokens; /* device: inputs (N), targets (N), buckets (3N + 1), one upload */
    int32_t *inputs, *targets, *buckets; /* into tokens */
    int32_t *tokens_host;                /* the same on the host */
    int nbuckets, counted;
    void **x;         /* L + 1 residual stream buffers (N,C) */
    cu_layer_t *acts; /* L + 1: a set per layer, the last the scratch (keep_from) */
    /* forward scratch (materialized attention only: flash attention reads the
     * heads where they lie, so c_attn writes straight into the saved qkvr) */
    bool flash;
    void *qkv, *attn_y; /* (N,3C), (N,C) */
    /* head */
    void *lnf, *logits; /* (N,C), (N,Vp) */
    float *lnf_mean, *lnf_rstd, *losses, *loss_sum;
    float *logits_f32, *logits_host; /* keep_logits: (N,V) device, host */
    /* backward */
    void *dres, *dres2, *dln, *datty, *dqkv, *datt, *attn_scratch, *dfch;
    void *stream;
    size_t U, att_bytes;     /* one (N,C) bf16 buffer; attention's saved bytes */
    bool fp8;                /* gpt2_cu_fp8 */
    nn_cuda_fp8_plan_t fp8p; /* the scales, records and history: product 4 l + k */
    void *fp8_scratch;       /* nn_cuda_fp8_conv1d_scratch_bytes of the largest product */
};

static void *cu_alloc(gpt2_cu_t *cu, size_t bytes, bmt_error_t *err)
{
    return bmt_alloc(cu->ctx, BMT_MEM_ACTIVATION, bytes, err);
}

/* *p, stream-ordered, unless it exists already (a set reused from layer to
 * layer, or kept by a forward without backward). */
static int need(gpt2_cu_t *cu, void **p, size_t bytes, bmt_error_t *err)
{
    if (*p == NULL)
        *p = bmt_alloc_async(cu->ctx, BMT_MEM_ACTIVATION, bytes, cu->stream, err);
    return *p ? 0 : -1;
}

/* Give back the buffers named, once the work enqueued so far is done. */
#define drop(cu, ...) drop_all(cu, (void **[]){ __VA_ARGS__, NULL })
static void drop_all(gpt2_cu_t *cu, void **const *bufs)
{
    for (; *bufs; bufs++) {
        bmt_free_async(cu->ctx, **bufs, cu->stream);
        **bufs = NULL;
    }
}

/* What lives as long as the model: the host arrays, the tokens, the head's
 * statistics and losses, and the materialized attention's scratch. */
static int alloc_all(gpt2_cu_t *cu, bmt_error_t *err)
{
    const size_t N = (size_t)cu->N, C = (size_t)cu->cfg.n_embd, h = 2; /* bf16 bytes */
    const int L = cu->cfg.n_layer;
    if ((cu->x = calloc((size_t)L + 1, sizeof(void *))) == NULL ||
        (cu->acts = calloc((size_t)L + 1, sizeof(cu_layer_t))) == NULL ||
        (cu->tokens_host = malloc((5 * N + 1) * sizeof(int32_t))) == NULL) {
        snprintf(err->text, sizeof(err->text), "gpt2: out of host memory");
        return -1;
    }
    if (!cu->flash && (!(cu->qkv = cu_alloc(cu, 3 * N * C * h, err)) ||
                       !(cu->attn_y = cu_alloc(cu, N * C * h, err)) ||
                       !(cu->attn_scratch = cu_alloc(cu, 4 * N * C * h, err))))
        return -1;
    if (!(cu->tokens = cu_alloc(cu, (5 * N + 1) * 4, err)) ||
        !(cu->lnf_mean = cu_alloc(cu, N * 4, err)) || !(cu->lnf_rstd = cu_alloc(cu, N * 4, err)) ||
        !(cu->losses = cu_alloc(cu, N * 4, err)) || !(cu->loss_sum = cu_alloc(cu, 4, err)))
        return -1;
    cu->inputs = cu->tokens, cu->targets = cu->tokens + N, cu->buckets = cu->tokens + 2 * N;
    return 0;
}

gpt2_cu_t *gpt2_cu_create(bmt_ctx_t *ctx, const gpt2_config_t *cfg, int B, int T, bool ckpt,
                          bmt_error_t *err)
{
    gpt2_cu_t *cu = calloc(1, sizeof(*cu));
    if (cu == NULL) {
        snprintf(err->text, sizeof(err->text), "gpt2: out of host memory");
        return NULL;
    }
    cu->ctx = ctx;
    cu->cfg = *cfg;
    cu->B = B, cu->T = T, cu->N = B * T;
    cu->Vp = (cfg->vocab_size + 63) / 64 * 64;
    cu->head_rows = cu->N;
    if (ckpt) { /* chunks of at most 256 MiB of logits, at least 4, rows a multiple of 64 */
        const size_t all = (size_t)cu->N * cu->Vp * 2;
        size_t chunks = (all + (256u << 20) - 1) / (256u << 20);
        chunks = chunks < 4 ? 4 : chunks;
        const int rows = (int)(((size_t)cu->N + chunks - 1) / chunks + 63) / 64 * 64;
        cu->head_rows = rows < cu->N ? rows : cu->N;
    }
    cu->chunk_rows = cu->head_rows;
    cu->acts_of = -1;
    cu->ckpt = ckpt;
    cu->keep_from = ckpt ? cfg->n_layer : 0;
    cu->flash = nn_cuda_attention_is_flash(cfg->n_embd, cfg->n_head) != 0;
    cu->stream = bmt_compute_stream(ctx);
    cu->U = (size_t)cu->N * cfg->n_embd * 2;
    cu->att_bytes = nn_cuda_attention_saved_bytes(B, T, cfg->n_embd, cfg->n_head);
    const int max_cols = 4 * cfg->n_embd;
    if ((cu->workspace =
             bmt_alloc(ctx, BMT_MEM_WORKSPACE, nn_cuda_workspace_bytes(max_cols), err)) == NULL ||
        (cu->h = nn_cuda_create(bmt_compute_stream(ctx), cu->workspace, max_cols, err)) == NULL ||
        alloc_all(cu, err) < 0) {
        gpt2_cu_destroy(cu);
        return NULL;
    }
    return cu;
}

void gpt2_cu_destroy(gpt2_cu_t *cu)
{
    if (cu == NULL)
        return;
    bmt_ctx_t *ctx = cu->ctx;
    bmt_error_t e;
    bmt_device_synchronize(ctx, &e); /* nothing may still run on what is freed */
    nn_cuda_destroy(cu->h);
    const int L = cu->cfg.n_layer;
    if (cu->x)
        for (int l = 0; l <= L; l++)
            bmt_free(ctx, cu->x[l]);
    if (cu->acts)
        for (int s = 0; s <= L; s++) {
            cu_layer_t *a = &cu->acts[s];
            void *all[] = { a->ln1,      a->qkvr,     a->att,      a->atty,     a->res2,
                            a->ln2,      a->fch,      a->fch_gelu, a->ln1_mean, a->ln1_rstd,
                            a->ln2_mean, a->ln2_rstd, a->ln1_q,    a->atty_q,   a->ln2_q,
                            a->gelu_q,   a->wq };
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                bmt_free(ctx, all[i]);
        }
    void *rest[] = { cu->tokens,     cu->qkv,          cu->attn_y, cu->lnf,       cu->logits,
                     cu->lnf_mean,   cu->lnf_rstd,     cu->losses, cu->loss_sum,  cu->logits_f32,
                     cu->dres,       cu->dres2,        cu->dln,    cu->datty,     cu->dqkv,
                     cu->datt,       cu->attn_scratch, cu->dfch,   cu->workspace, cu->fp8p.s,
                     cu->fp8_scratch };
    for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++)
        bmt_free(ctx, rest[i]);
    if (cu->katty)
        for (int l = 0; l < L; l++) {
            bmt_free(ctx, cu->katty[l]);
            bmt_free(ctx, cu->katt[l]);
        }
    free(cu->katty);
    free(cu->katt);
    free(cu->x);
    free(cu->acts);
    free(cu->tokens_host);
    free(cu->logits_host);
    free(cu);
}

int gpt2_cu_set_batch(gpt2_cu_t *cu, const int32_t *inputs, const int32_t *targets, int counted,
                      bmt_error_t *err)
{
    const size_t N = (size_t)cu->N;
    int32_t *h = cu->tokens_host;
    memcpy(h, inputs, N * 4);
    memcpy(h + N, targets, N * 4);
    int U = nn_token_buckets(inputs, cu->N, cu->cfg.vocab_size, h + 2 * N);
    if (U < 0) {
        snprintf(err->text, sizeof(err->text), "gpt2: out of host memory");
        return -1;
    }
    /* One upload (it waits for the context's streams first: the previous
     * micro-batch's backward may still read these buffers). */
    if (bmt_mem_upload(cu->ctx, cu->tokens, h, (2 * N + 2 * (size_t)U + 1 + N) * 4, err) < 0)
        return -1;
    cu->nbuckets = U;
    cu->counted = counted;
    cu->acts_of = -1;
    return 0;
}

/* Parameter order: model.c's P_* enums (repeated here as indices). */
enum {
    LN1_W,
    LN1_B,
    ATTN_W,
    ATTN_B,
    APROJ_W,
    APROJ_B,
    LN2_W,
    LN2_B,
    FC_W,
    FC_B,
    FPROJ_W,
    FPROJ_B
};
enum {
    WTE,
    WPE,
    LNF_W,
    LNF_B
};

static cu_layer_t *layer_of(gpt2_cu_t *cu, int l)
{
    return &cu->acts[l >= cu->keep_from ? l : cu->cfg.n_layer];
}

/* The layer's products: k 0 c_attn, 1 attn.c_proj, 2 c_fc, 3 mlp.c_proj. */
static nn_cuda_fp8_scales_t fp8_scales(gpt2_cu_t *cu, int l, int k)
{
    return nn_cuda_fp8_plan_at(&cu->fp8p, 4 * l + k);
}

/* A forward begins: with FP8, when a backward ended since, the pass's
 * records close (nn_fp8_plan_begin's bookkeeping, on the device). */
static int fp8_begin(gpt2_cu_t *cu, bmt_error_t *err)
{
    return cu->fp8 ? nn_cuda_fp8_plan_begin(cu->h, &cu->fp8p, err) : 0;
}

/* FP8: product k's weight codes kept in layer l's set (a->wq: c_attn's,
 * attn.c_proj's, c_fc's, mlp.c_proj's, one after another), or NULL where the
 * set does not keep them: in a recomputed layer the recomputation stops
 * before mlp.c_proj, so its backward converts the weight again. */
static uint8_t *wq_at(gpt2_cu_t *cu, int l, int k)
{
    static const size_t at[4] = { 0, 3, 4, 8 }; /* in C^2 */
    const size_t C = (size_t)cu->cfg.n_embd;
    const cu_layer_t *a = layer_of(cu, l);
    return a->wq == NULL || (l < cu->keep_from && k == 3) ? NULL : (uint8_t *)a->wq + at[k] * C * C;
}

/* out (N,OC) = [res +] inp x W + b, in bf16; or with FP8 operands, the
 * input's codes saved in *xq for the backward (made here if need be), the
 * weight's in wq_at. res (the residual stream, or NULL): read as the
 * product's C input, the sum rounded once (attn and mlp c_proj). gelu (FP8
 * only): the product's input is GELU(inp), made inside the conversion (the
 * bf16 path takes GELU's output from nn_cuda_matmul_gelu_forward instead). */
static int linear_forward(gpt2_cu_t *cu, int l, int k, void *out, const void *res, void **xq,
                          const void *inp, bool gelu, const void *w, const void *b, int IC, int OC,
                          bmt_error_t *err)
{
    if (!cu->fp8)
        return res ? nn_cuda_matmul_residual_forward(cu->h, out, res, inp, w, b, cu->N, IC, OC, 0,
                                                     err)
                   : nn_cuda_matmul_forward(cu->h, out, OC, inp, w, b, cu->N, IC, OC, 0, err);
    const nn_cuda_fp8_scales_t sc = fp8_scales(cu, l, k);
    if (need(cu, xq, (size_t)cu->N * IC, err) < 0)
        return -1;
    return res ? nn_cuda_fp8_conv1d_residual_forward(cu->h, out, res, *xq, wq_at(cu, l, k), inp,
                                                     gelu, w, b, cu->N, IC, OC, 1, &sc,
                                                     cu->fp8_scratch, err)
               : nn_cuda_fp8_conv1d_forward(cu->h, out, *xq, wq_at(cu, l, k), inp, gelu, w, b,
                                            cu->N, IC, OC, 1, &sc, cu->fp8_scratch, err);
}

/* Its backward: from the bf16 input, or the FP8 codes linear_forward saved.
 * pre (FP8 only): dout is GELU's output gradient and pre GELU's input, the
 * product's output gradient made from both inside the conversion (the bf16
 * path takes it from nn_cuda_matmul_backward_dgelu's epilogue instead). */
static int linear_backward(gpt2_cu_t *cu, int l, int k, void *dinp, float *dw, float *db,
                           const void *dout, const void *pre, const void *xq, const void *inp,
                           const void *w, int IC, int OC, int add, bmt_error_t *err)
{
    if (!cu->fp8)
        return nn_cuda_matmul_backward(cu->h, dinp, dw, db, dout, OC, inp, w, cu->N, IC, OC, 0, add,
                                       err);
    const nn_cuda_fp8_scales_t sc = fp8_scales(cu, l, k);
    return nn_cuda_fp8_conv1d_backward(cu->h, dinp, dw, db, dout, pre, xq, wq_at(cu, l, k), w,
                                       cu->N, IC, OC, &sc, cu->fp8_scratch, add, err);
}

/* The input's transposed codes of product k, as its forward saves them (a
 * recomputation that stops before the product). */
static int linear_codes(gpt2_cu_t *cu, int l, int k, void *xqt, const void *inp, bool gelu, int IC,
                        bmt_error_t *err)
{
    const nn_cuda_fp8_scales_t sc = fp8_scales(cu, l, k);
    return nn_cuda_fp8_codes(cu->h, NULL, xqt, inp, gelu, cu->N, IC, NN_FP8_E4M3, &sc, 0, err);
}

/* A recomputation (checkpointing) stops once the activations that the
 * backward reads exist: x_{l+1} is kept, so the MLP's projection and the
 * last residual are not taken again. The attention's projection writes
 * res2 = x + its output in one product (bf16 and FP8 alike). Each buffer is
 * made just before its first writer. */
static int layer_forward(gpt2_cu_t *cu, int l, void *const *p, bool recompute, bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    const int N = cu->N, C = cu->cfg.n_embd;
    const size_t NC = (size_t)N * C, U = cu->U, S = (size_t)N * 4;
    cu_layer_t *a = layer_of(cu, l);
    void *x = cu->x[l];
    void **atty = cu->keep_attn ? &cu->katty[l] : &a->atty,
         **att = cu->keep_attn ? &cu->katt[l] : &a->att;
    const bool attend = !(recompute && cu->keep_attn); /* else kept from the forward */
    if ((!recompute && need(cu, &cu->x[l + 1], U, err) < 0) || need(cu, &a->ln1, U, err) < 0 ||
        need(cu, &a->ln1_mean, S, err) < 0 || need(cu, &a->ln1_rstd, S, err) < 0 ||
        need(cu, &a->qkvr, 3 * U, err) < 0 || need(cu, att, cu->att_bytes, err) < 0 ||
        need(cu, atty, U, err) < 0 || need(cu, &a->res2, U, err) < 0 ||
        (cu->fp8 && need(cu, &a->wq, 12 * (size_t)C * C, err) < 0))
        return -1;
    void *out = cu->x[l + 1];
    void *qkv = cu->flash ? a->qkvr : cu->qkv;
    if (nn_cuda_layernorm_forward(h, a->ln1, a->ln1_mean, a->ln1_rstd, x, p[LN1_W], p[LN1_B], N, C,
                                  err) < 0 ||
        linear_forward(cu, l, 0, qkv, NULL, &a->ln1_q, a->ln1, false, p[ATTN_W], p[ATTN_B], C,
                       3 * C, err) < 0)
        return -1;
    if (cu->fp8) /* its codes are what the backward reads */
        drop(cu, &a->ln1);
    if ((attend && nn_cuda_attention_forward(h, *atty, a->qkvr, *att, qkv, cu->attn_y, cu->B, cu->T,
                                             C, cu->cfg.n_head, err) < 0) ||
        linear_forward(cu, l, 1, a->res2, x, &a->atty_q, *atty, false, p[APROJ_W], p[APROJ_B], C, C,
                       err) < 0)
        return -1;
    /* FP8: GELU's output exists only as its codes, made from c_fc's output by
     * mlp.c_proj's conversion (no bf16 copy written or read). */
    if (need(cu, &a->ln2, U, err) < 0 || need(cu, &a->ln2_mean, S, err) < 0 ||
        need(cu, &a->ln2_rstd, S, err) < 0 || need(cu, &a->fch, 4 * U, err) < 0 ||
        (!cu->fp8 && need(cu, &a->fch_gelu, 4 * U, err) < 0) ||
        nn_cuda_layernorm_forward(h, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p[LN2_W], p[LN2_B],
                                  N, C, err) < 0)
        return -1;
    if (!cu->fp8 && nn_cuda_matmul_gelu_forward(h, a->fch_gelu, a->fch, a->ln2, p[FC_W], p[FC_B], N,
                                                C, 4 * C, err) < 0)
        return -1;
    if (cu->fp8 && linear_forward(cu, l, 2, a->fch, NULL, &a->ln2_q, a->ln2, false, p[FC_W],
                                  p[FC_B], C, 4 * C, err) < 0)
        return -1;
    if (cu->fp8)
        drop(cu, &a->ln2);
    if (l < cu->keep_from)
        cu->acts_of = l; /* the scratch set holds layer l's */
    if (recompute)       /* with FP8, GELU's codes are what the backward reads */
        return cu->fp8 && (need(cu, &a->gelu_q, 4 * NC, err) < 0 ||
                           linear_codes(cu, l, 3, a->gelu_q, a->fch, true, 4 * C, err) < 0)
                   ? -1
                   : 0;
    return linear_forward(cu, l, 3, out, a->res2, &a->gelu_q, cu->fp8 ? a->fch : a->fch_gelu,
                          cu->fp8, p[FPROJ_W], p[FPROJ_B], 4 * C, C, err);
}

/* cu->dres: in, the gradient w.r.t. x[l+1]; out, w.r.t. x[l]. Every buffer
 * goes back as soon as its last reader is enqueued: the layer's saved set
 * (a recomputation or the next forward makes it again) and x[l]. Each of
 * the layer's gradients is written by one call: added into (add), or
 * written (add 0: fresh gradients, bmt_block_call_t.grads_fresh). */
static int layer_backward(gpt2_cu_t *cu, int l, void *const *p, float *const *g, int add,
                          bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    const int N = cu->N, C = cu->cfg.n_embd;
    const size_t U = cu->U;
    cu_layer_t *a = layer_of(cu, l);
    void **atty = cu->keep_attn ? &cu->katty[l] : &a->atty,
         **att = cu->keep_attn ? &cu->katt[l] : &a->att;
    if (l < cu->keep_from)
        cu->acts_of = -1; /* the scratch set is consumed here */
    /* MLP projection. bf16: the weight's gradient first, then GELU's output is
     * dead and dfch can take its place, GELU's gradient made by the product's
     * epilogue. FP8: GELU's output is gone already (its codes are half its
     * size), so one call takes both and converts the gradient once; dfch then
     * holds GELU's output gradient, and c_fc's backward conversion makes its
     * input gradient from it and c_fc's output (no GELU kernel). */
    if (cu->fp8) {
        if (need(cu, &cu->dfch, 4 * U, err) < 0 ||
            linear_backward(cu, l, 3, cu->dfch, g[FPROJ_W], g[FPROJ_B], cu->dres, NULL, a->gelu_q,
                            NULL, p[FPROJ_W], 4 * C, C, add, err) < 0)
            return -1;
        drop(cu, &a->gelu_q);
    } else {
        if (linear_backward(cu, l, 3, NULL, g[FPROJ_W], g[FPROJ_B], cu->dres, NULL, NULL,
                            a->fch_gelu, p[FPROJ_W], 4 * C, C, add, err) < 0)
            return -1;
        drop(cu, &a->fch_gelu);
        if (need(cu, &cu->dfch, 4 * U, err) < 0 ||
            nn_cuda_matmul_backward_dgelu(h, cu->dfch, NULL, NULL, cu->dres, C, NULL, p[FPROJ_W],
                                          a->fch, N, 4 * C, C, add, err) < 0)
            return -1;
        drop(cu, &a->fch);
    }
    if (need(cu, &cu->dln, U, err) < 0 ||
        linear_backward(cu, l, 2, cu->dln, g[FC_W], g[FC_B], cu->dfch, cu->fp8 ? a->fch : NULL,
                        a->ln2_q, a->ln2, p[FC_W], C, 4 * C, add, err) < 0)
        return -1;
    drop(cu, &cu->dfch, &a->fch, &a->ln2, &a->ln2_q);
    if (need(cu, &cu->dres2, U, err) < 0 ||
        nn_cuda_layernorm_backward(h, cu->dres2, cu->dres, g[LN2_W], g[LN2_B], cu->dln, a->res2,
                                   p[LN2_W], a->ln2_mean, a->ln2_rstd, N, C, add, err) < 0)
        return -1;
    drop(cu, &cu->dln, &a->res2, &a->ln2_mean, &a->ln2_rstd);
    if (need(cu, &cu->datty, U, err) < 0 ||
        linear_backward(cu, l, 1, cu->datty, g[APROJ_W], g[APROJ_B], cu->dres2, NULL, a->atty_q,
                        *atty, p[APROJ_W], C, C, add, err) < 0 ||
        need(cu, &cu->dqkv, 3 * U, err) < 0 || need(cu, &cu->datt, cu->att_bytes, err) < 0 ||
        nn_cuda_attention_backward(h, cu->dqkv, cu->datty, *atty, a->qkvr, *att, cu->datt,
                                   cu->attn_scratch, cu->B, cu->T, C, cu->cfg.n_head, err) < 0)
        return -1;
    drop(cu, &cu->datty, &cu->datt, atty, &a->qkvr, att, &a->atty_q);
    if (need(cu, &cu->dln, U, err) < 0 ||
        linear_backward(cu, l, 0, cu->dln, g[ATTN_W], g[ATTN_B], cu->dqkv, NULL, a->ln1_q, a->ln1,
                        p[ATTN_W], C, 3 * C, add, err) < 0)
        return -1;
    drop(cu, &cu->dqkv, &a->ln1, &a->ln1_q, &a->wq);
    if (nn_cuda_layernorm_backward(h, cu->dres, cu->dres2, g[LN1_W], g[LN1_B], cu->dln, cu->x[l],
                                   p[LN1_W], a->ln1_mean, a->ln1_rstd, N, C, add, err) < 0)
        return -1;
    drop(cu, &cu->dln, &cu->dres2, &a->ln1_mean, &a->ln1_rstd, &cu->x[l]);
    return 0;
}

/* Logits of rows [r0, r0 + n) into the logits buffer, then their losses, and
 * d loss / d logits in their place. */
static int head_chunk(gpt2_cu_t *cu, void *const *p, int r0, int n, bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    const int C = cu->cfg.n_embd, V = cu->cfg.vocab_size;
    const float dloss = cu->counted ? 1.0f / (float)cu->counted : 0.0f;
    const void *lnf = (const char *)cu->lnf + (size_t)r0 * C * 2;
    if (nn_cuda_matmul_forward(h, cu->logits, cu->Vp, lnf, p[WTE], NULL, n, C, V, 1, err) < 0 ||
        (cu->logits_f32 &&
         nn_cuda_to_f32(h, cu->logits_f32 + (size_t)r0 * V, cu->logits, n, V, cu->Vp, err) < 0) ||
        nn_cuda_crossentropy(h, cu->losses + r0, cu->logits, cu->Vp, cu->targets + r0, dloss, n, V,
                             err) < 0)
        return -1;
    return 0;
}

static int head_forward(gpt2_cu_t *cu, void *const *p, bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    const int N = cu->N, C = cu->cfg.n_embd;
    const bool chunked = cu->head_rows < N; /* the backward makes each chunk's logits again */
    if (need(cu, &cu->lnf, cu->U, err) < 0 ||
        need(cu, &cu->logits, (size_t)cu->head_rows * cu->Vp * 2, err) < 0 ||
        nn_cuda_layernorm_forward(h, cu->lnf, cu->lnf_mean, cu->lnf_rstd, cu->x[cu->cfg.n_layer],
                                  p[LNF_W], p[LNF_B], N, C, err) < 0)
        return -1;
    for (int r0 = 0; r0 < N; r0 += cu->head_rows)
        if (head_chunk(cu, p, r0, N - r0 < cu->head_rows ? N - r0 : cu->head_rows, err) < 0)
            return -1;
    if (chunked)
        drop(cu, &cu->logits);
    return nn_cuda_sum(h, cu->loss_sum, cu->losses, N, err);
}

/* The head's use of the top block (wte, wpe, lnf): fresh gradients (the
 * first use in backward order) are written: wte's by the first chunk's
 * product, lnf's by the norm, wpe's (the embedding's alone) zeroed. */
static int head_backward(gpt2_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    nn_cuda_t *h = cu->h;
    void *const *p = c->params;
    float *const *g = (float *const *)c->grads;
    const int N = cu->N, C = cu->cfg.n_embd, V = cu->cfg.vocab_size;
    const int L = cu->cfg.n_layer, add = !c->grads_fresh;
    if (need(cu, &cu->dres, cu->U, err) < 0)
        return -1;
    if (c->grads_fresh &&
        bmt_block_call_zero_grad(c, cu->counted == 0 ? -1 : WPE, err) < 0) /* -1: all */
        return -1;
    if (cu->counted == 0) { /* no position counts: the loss does not depend on anything */
        drop(cu, &cu->logits, &cu->lnf, &cu->x[L]);
        return cudaMemsetAsync(cu->dres, 0, cu->U, (cudaStream_t)cu->stream) == cudaSuccess
                   ? 0
                   : (snprintf(err->text, sizeof(err->text), "gpt2: cudaMemsetAsync failed"), -1);
    }
    if (need(cu, &cu->dln, cu->U, err) < 0 ||
        need(cu, &cu->logits, (size_t)cu->head_rows * cu->Vp * 2, err) < 0)
        return -1;
    /* All rows at once: the forward left d loss / d logits in the logits
     * buffer. In chunks: each chunk's again, then its products. */
    for (int r0 = 0; r0 < N; r0 += cu->head_rows) {
        const int n = N - r0 < cu->head_rows ? N - r0 : cu->head_rows;
        const size_t off = (size_t)r0 * C * 2;
        if ((cu->head_rows < N && head_chunk(cu, p, r0, n, err) < 0) ||
            nn_cuda_matmul_backward(h, (char *)cu->dln + off, g[WTE], NULL, cu->logits, cu->Vp,
                                    (const char *)cu->lnf + off, p[WTE], n, C, V, 1, add || r0 > 0,
                                    err) < 0)
            return -1;
    }
    if (nn_cuda_layernorm_backward(h, cu->dres, NULL, g[LNF_W], g[LNF_B], cu->dln, cu->x[L],
                                   p[LNF_W], cu->lnf_mean, cu->lnf_rstd, N, C, add, err) < 0)
        return -1;
    drop(cu, &cu->dln, &cu->logits, &cu->lnf, &cu->x[L]);
    return 0;
}

int gpt2_cu_forward(gpt2_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    void *const *p = c->params;
    /* Recomputations with nothing to do: x_0 is kept, the head's backward does
     * its own, and the scratch set may still hold this layer's activations. */
    if (c->recompute &&
        (c->index == 0 || c->index == cu->cfg.n_layer + 1 || cu->acts_of == c->index - 1))
        return 0;
    if (c->index == 0)
        return fp8_begin(cu, err) < 0 || need(cu, &cu->x[0], cu->U, err) < 0
                   ? -1
                   : nn_cuda_encoder_forward(cu->h, cu->x[0], cu->inputs, p[WTE], p[WPE], cu->B,
                                             cu->T, cu->cfg.n_embd, err);
    if (c->index == cu->cfg.n_layer + 1)
        return head_forward(cu, p, err);
    return layer_forward(cu, c->index - 1, p, c->recompute, err);
}

int gpt2_cu_backward(gpt2_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    void *const *p = c->params;
    float *const *g = (float *const *)c->grads;
    if (c->index == 0) { /* fresh (a group of two or more): zeros to add into */
        if ((c->grads_fresh && bmt_block_call_zero_grad(c, -1, err) < 0) ||
            nn_cuda_encoder_backward(cu->h, g[WTE], g[WPE], cu->dres, cu->buckets, cu->nbuckets,
                                     cu->B, cu->T, cu->cfg.n_embd, err) < 0)
            return -1;
        drop(cu, &cu->dres);
        if (cu->fp8) /* the pass's records close when the next forward begins */
            nn_cuda_fp8_plan_end(&cu->fp8p);
        return 0;
    }
    if (c->index == cu->cfg.n_layer + 1)
        return head_backward(cu, c, err);
    return layer_backward(cu, c->index - 1, p, g, !c->grads_fresh, err);
}

int gpt2_cu_loss(gpt2_cu_t *cu, float *loss, bmt_error_t *err)
{
    float sum;
    if (bmt_mem_download(cu->ctx, &sum, cu->loss_sum, sizeof(sum), err) < 0)
        return -1;
    *loss = cu->counted ? sum / (float)cu->counted : 0.0f;
    return 0;
}

int gpt2_cu_keep_logits(gpt2_cu_t *cu, bmt_error_t *err)
{
    const size_t n = (size_t)cu->N * cu->cfg.vocab_size;
    if (cu->logits_f32)
        return 0;
    if ((cu->logits_host = malloc(n * sizeof(float))) == NULL) {
        snprintf(err->text, sizeof(err->text), "gpt2: out of host memory for the logits");
        return -1;
    }
    return (cu->logits_f32 = cu_alloc(cu, n * sizeof(float), err)) ? 0 : -1;
}

const float *gpt2_cu_logits(gpt2_cu_t *cu, bmt_error_t *err)
{
    if (cu->logits_f32 == NULL) {
        snprintf(err->text, sizeof(err->text),
                 "gpt2: logits are not kept (gpt2_model_keep_logits)");
        return NULL;
    }
    const size_t n = (size_t)cu->N * cu->cfg.vocab_size;
    return bmt_mem_download(cu->ctx, cu->logits_host, cu->logits_f32, n * sizeof(float), err) < 0
               ? NULL
               : cu->logits_host;
}

int gpt2_cu_keep_layers(gpt2_cu_t *cu, int keep_from, bool head, bmt_error_t *err)
{
    (void)err; /* gpt2_model_keep_layers has made sure that no forward ran */
    cu->keep_from = keep_from;
    cu->head_rows = head ? cu->N : cu->chunk_rows;
    return 0;
}

void gpt2_cu_act_bytes(const gpt2_cu_t *cu, int64_t *layer, int64_t *head)
{
    const int64_t U = (int64_t)cu->U, S = (int64_t)cu->N * 4, C = cu->cfg.n_embd;
    /* layer_forward's set, (N,C) bf16 buffers in U: qkvr 3, res2 1, fch 4,
     * atty 1, and bf16 ln1, ln2 1 each and fch_gelu 4; or with FP8 the codes
     * of ln1, atty, ln2 (U/2 each) and GELU's (2 U) instead, and the weights'
     * (12 C^2 bytes). Then att and the four statistics. keep_attn's atty and
     * att live outside the set, kept for every layer anyway. */
    int64_t b = cu->fp8 ? 9 * U + 3 * U / 2 + 2 * U + 12 * C * C : 15 * U;
    b += 4 * S;
    if (cu->keep_attn)
        b -= U;
    else
        b += (int64_t)cu->att_bytes;
    *layer = b;
    *head = 2 * (int64_t)cu->Vp * (cu->N - cu->chunk_rows);
}

int gpt2_cu_keep_attention(gpt2_cu_t *cu, int mode, bmt_error_t *err)
{
    const bool on = mode < 0 ? cu->flash : mode != 0;
    if (on && !cu->flash) {
        snprintf(err->text, sizeof(err->text),
                 "gpt2: keeping the attention outputs needs flash attention (head size 16, 32 or "
                 "64; this model's is %d)",
                 cu->cfg.n_embd / cu->cfg.n_head);
        return -1;
    }
    const int L = cu->cfg.n_layer;
    if (on && cu->ckpt && cu->katty == NULL &&
        ((cu->katty = calloc((size_t)L, sizeof(void *))) == NULL ||
         (cu->katt = calloc((size_t)L, sizeof(void *))) == NULL)) {
        snprintf(err->text, sizeof(err->text), "gpt2: out of host memory");
        return -1;
    }
    if (!on && cu->katty) /* what a forward kept goes back; the scratch set takes over */
        for (int l = 0; l < L; l++)
            drop(cu, &cu->katty[l], &cu->katt[l]);
    cu->keep_attn = on && cu->ckpt; /* without checkpointing every layer keeps its set anyway */
    return 0;
}

int gpt2_cu_fp8(gpt2_cu_t *cu, int on, int history, bmt_error_t *err)
{
    const int N = cu->N, C = cu->cfg.n_embd, L = cu->cfg.n_layer;
    if (history < 0 || history > NN_FP8_HISTORY_MAX) {
        snprintf(err->text, sizeof(err->text),
                 "gpt2: an FP8 history of %d passes: give 0 (current scaling) to %d", history,
                 NN_FP8_HISTORY_MAX);
        return -1;
    }
    if (cu->fp8 && on && history != cu->fp8p.history) {
        snprintf(err->text, sizeof(err->text),
                 "gpt2: FP8's scaling cannot change once on (history %d, asked %d)",
                 cu->fp8p.history, history);
        return -1;
    }
    if (cu->fp8 == (on != 0))
        return 0;
    if (!on) {
        snprintf(err->text, sizeof(err->text), "gpt2: FP8 cannot be turned off once on");
        return -1;
    }
    if (N % 16 || C % 16) {
        snprintf(err->text, sizeof(err->text),
                 "gpt2: --fp8 1 on cuda wants batch x sequence (%d x %d = %d) and the width (%d) "
                 "to be multiples of 16 (the FP8 products' reduced dimensions): change -b or -t",
                 cu->B, cu->T, N, C);
        return -1;
    }
    size_t scratch = 0;
    const int shapes[4][2] = { { C, 3 * C }, { C, C }, { C, 4 * C }, { 4 * C, C } };
    for (int k = 0; k < 4; k++) {
        const size_t b = nn_cuda_fp8_conv1d_scratch_bytes(N, shapes[k][0], shapes[k][1]);
        scratch = b > scratch ? b : scratch;
    }
    const size_t bytes = nn_cuda_fp8_plan_bytes(L * 4, history);
    void *buf = cu_alloc(cu, bytes, err);
    if (buf == NULL || nn_cuda_fp8_plan_init(cu->h, &cu->fp8p, buf, L * 4, history, err) < 0 ||
        (cu->fp8_scratch = bmt_alloc(cu->ctx, BMT_MEM_WORKSPACE, scratch, err)) == NULL) {
        bmt_free(cu->ctx, buf);
        cu->fp8p.s = NULL;
        return -1;
    }
    cu->fp8 = true;
    return 0;
}

int gpt2_cu_fp8_stats(gpt2_cu_t *cu, nn_fp8_stats_t *st, bmt_error_t *err)
{
    unsigned long long d[2] = { 0, 0 };
    if (cu->fp8 && (fp8_begin(cu, err) < 0 || /* closes the last pass, as a forward would */
                    bmt_mem_download(cu->ctx, d, cu->fp8p.stats, sizeof(d), err) < 0))
        return -1;
    st->passes = cu->fp8p.passes, st->saturated = (long)d[0], st->unscalable = (long)d[1];
    return 0;
}

int gpt2_cu_gemm_tune(gpt2_cu_t *cu, int candidates, bmt_error_t *err)
{
    if (nn_cuda_gemm_tune(cu->h, candidates) == 0)
        return 0;
    snprintf(err->text, sizeof(err->text), "gpt2: %d product candidates to time: give 0 to %d",
             candidates, NN_GEMM_TUNE_MAX);
    return -1;
}

#else /* no CUDA */

static int no_cuda(bmt_error_t *err)
{
    snprintf(err->text, sizeof(err->text),
             "gpt2: this build has no CUDA: rebuild where nvcc is found, or use --device cpu");
    return -1;
}

gpt2_cu_t *gpt2_cu_create(bmt_ctx_t *ctx, const gpt2_config_t *cfg, int B, int T, bool ckpt,
                          bmt_error_t *err)
{
    (void)ctx, (void)cfg, (void)B, (void)T, (void)ckpt;
    no_cuda(err);
    return NULL;
}
void gpt2_cu_destroy(gpt2_cu_t *cu) { (void)cu; }
int gpt2_cu_set_batch(gpt2_cu_t *cu, const int32_t *i, const int32_t *t, int n, bmt_error_t *err)
{
    (void)cu, (void)i, (void)t, (void)n;
    return no_cuda(err);
}
int gpt2_cu_forward(gpt2_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)cu, (void)c;
    return no_cuda(err);
}
int gpt2_cu_backward(gpt2_cu_t *cu, const bmt_block_call_t *c, bmt_error_t *err)
{
    (void)cu, (void)c;
    return no_cuda(err);
}
int gpt2_cu_loss(gpt2_cu_t *cu, float *loss, bmt_error_t *err)
{
    (void)cu, (void)loss;
    return no_cuda(err);
}
int gpt2_cu_keep_logits(gpt2_cu_t *cu, bmt_error_t *err)
{
    (void)cu;
    return no_cuda(err);
}
const float *gpt2_cu_logits(gpt2_cu_t *cu, bmt_error_t *err)
{
    (void)cu;
    no_cuda(err);
    return NULL;
}
int gpt2_cu_gemm_tune(gpt2_cu_t *cu, int candidates, bmt_error_t *err)
{
    (void)cu, (void)candidates;
    return no_cuda(err);
}
int gpt2_cu_keep_layers(gpt2_cu_t *cu, int keep_from, bool head, bmt_error_t *err)
{
    (void)cu, (void)keep_from, (void)head;
    return no_cuda(err);
}
void gpt2_cu_act_bytes(const gpt2_cu_t *cu, int64_t *layer, int64_t *head)
{
    (void)cu;
    *layer = *head = 0;
}
int gpt2_cu_keep_attention(gpt2_cu_t *cu, int mode, bmt_error_t *err)
{
    (void)cu, (void)mode;
    return no_cuda(err);
}
int gpt2_cu_fp8(gpt2_cu_t *cu, int on, int history, bmt_error_t *err)
{
    (void)cu, (void)on, (void)history;
    return no_cuda(err);
}
int gpt2_cu_fp8_stats(gpt2_cu_t *cu, nn_fp8_stats_t *st, bmt_error_t *err)
{
    (void)cu, (void)st;
    return no_cuda(err);
}
#endif
